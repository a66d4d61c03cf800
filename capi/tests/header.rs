//! include/ubdirect.h is what cbindgen makes of the sources: a stale header fails here.
//! `UBDIRECT_BLESS_HEADER=1 cargo test -p ubdirect-capi --test header` writes it anew.

use std::path::Path;

#[test]
fn the_checked_in_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses the C API")
        .write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("UTF-8 header");
    let path = dir.join("include/ubdirect.h");
    if std::env::var_os("UBDIRECT_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write the header");
        return;
    }
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old != fresh {
        let tmp = std::env::temp_dir().join(format!("ubdirect-{}.h", std::process::id()));
        std::fs::write(&tmp, &fresh).expect("write the fresh header");
        panic!(
            "capi/include/ubdirect.h is stale: the sources generate {} instead (diff them); \
             run UBDIRECT_BLESS_HEADER=1 cargo test -p ubdirect-capi --test header and commit it",
            tmp.display()
        );
    }
}
