//! The builder on the host: a file through io_uring into a null sink, verified; settings that
//! cannot work together refused before anything opens.

use std::path::PathBuf;

use super::*;

fn temp_file(tag: &str, len: usize) -> PathBuf {
    let p = std::env::temp_dir().join(format!("ubd-builder-{tag}-{}", std::process::id()));
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&p, data).unwrap();
    p
}

fn refusal(b: PipelineBuilder) -> SetupError {
    match b.run() {
        Err(PipelineRunError::Setup(e)) => e,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_streams_into_a_null_sink_verified_with_segments_first() {
    let p = temp_file("stream", 1 << 20);
    let reports = Pipeline::builder()
        .source(SourceSpec::File(p.clone()))
        .block_size(64 << 10)
        .queue_depth(4)
        .file_io(FileIo::Buffered)
        .segments(true)
        .verify(true)
        .run()
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    let labels: Vec<&str> = reports.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "segment: source -> UB (sink null)",
            "segment: UB -> sink (no source)",
            "pipeline"
        ]
    );
    let last = reports.last().unwrap();
    assert_eq!(last.bytes, 1 << 20);
    assert!(last.verify.as_ref().is_some_and(|v| v.ok), "{last}");
}

#[test]
fn repeated_runs_are_labelled_in_order() {
    let p = temp_file("repeat", 256 << 10);
    let reports = Pipeline::builder()
        .source(SourceSpec::File(p.clone()))
        .block_size(64 << 10)
        .queue_depth(2)
        .file_io(FileIo::Buffered)
        .repeat(2)
        .run()
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    let labels: Vec<&str> = reports.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["pipeline (run 1/2)", "pipeline (run 2/2)"]);
}

#[test]
fn settings_that_cannot_work_are_refused_in_the_builder_s_terms() {
    let file = || Pipeline::builder().source(SourceSpec::File("/nonexistent".into()));
    assert!(matches!(refusal(Pipeline::builder()), SetupError::NoSource));
    assert!(matches!(
        refusal(file().queue_depth(0)),
        SetupError::QueueDepthZero
    ));
    assert!(matches!(
        refusal(file().pool_blocks(0)),
        SetupError::PoolEmpty { .. }
    ));
    let nvme = SourceSpec::Nvme {
        addr: "0000:00:04.0".parse().unwrap(),
        nsid: None,
    };
    assert!(matches!(
        refusal(Pipeline::builder().source(nvme.clone()).mode(Mode::Copy)),
        SetupError::CopyNeedsFile
    ));
    let mapped = MappedSettings {
        copy_size: Some(1 << 20),
        ..Default::default()
    };
    assert!(matches!(
        refusal(Pipeline::builder().source(nvme).mapped(mapped.clone())),
        SetupError::MappedSettingsUnused
    ));
    assert!(matches!(
        refusal(file().file_io(FileIo::Buffered).mapped(mapped)),
        SetupError::MappedSettingsUnused
    ));
    assert!(matches!(refusal(file().repeat(0)), SetupError::RepeatZero));
    assert!(matches!(
        refusal(file().repeat(2).verify(true)),
        SetupError::VerifyRepeat
    ));
    assert!(matches!(
        refusal(file().file_io(FileIo::Mapped)),
        SetupError::MappedNeedsCuda
    ));
}

#[test]
fn a_missing_file_is_named() {
    let e = Pipeline::builder()
        .source(SourceSpec::File("/nonexistent/x".into()))
        .run()
        .unwrap_err();
    assert!(
        e.to_string().starts_with("cannot open /nonexistent/x: "),
        "{e}"
    );
}

#[test]
fn mapped_plans_refuse_a_start_past_the_end_and_a_window_over_the_cap() {
    let s = MappedSettings::default();
    assert!(matches!(
        mapped_plan(&s, 1 << 20, 1 << 20),
        Err(SetupError::StartPastEnd { .. })
    ));
    let s = MappedSettings {
        copy_size: Some(1 << 20),
        window: Some(64 << 20),
        cap: Some(32 << 20),
        ..Default::default()
    };
    assert!(matches!(
        mapped_plan(&s, 0, 1 << 30),
        Err(SetupError::WindowOverCap { .. })
    ));
}
