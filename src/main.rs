//! `ubdirect`: the operator's command line (devices, doctor, and the driver tools).

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Usage errors exit 2 and --help/--version exit 0 (clap's conventions).
    let args = cli::Cli::parse();
    init_tracing(args.verbose);
    cli::nvmf::set_secret_files(cli::nvmf::SecretFiles {
        host: args.dhchap_secret_file.clone(),
        ctrl: args.dhchap_ctrl_secret_file.clone(),
    });
    match args.command.run() {
        Ok(outcome) => outcome.exit_code(),
        Err(e) => {
            let (msg, causes) = cli::errors::user_message(e.as_ref());
            eprintln!("ubdirect: error: {msg}");
            for c in causes {
                eprintln!("ubdirect:   caused by: {c}");
            }
            ExitCode::from(1)
        }
    }
}

/// Log to stderr; `RUST_LOG` wins over `-v` (warn, -v info, -vv debug, -vvv trace).
/// Without `-v`, vfio-ioctls' warning about IRQ indexes a device does not implement (the
/// error/request IRQs of emulated devices, logged on every open) is kept quiet.
fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => "warn,vfio_ioctls=error",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
