//! `--json`: one document shape for every subcommand, versioned and documented in
//! `docs/json.md`. Every document is an object `{"schema": "ubdirect/1", "command": ..., ...}`;
//! rates are `bytes_per_s` and `iops`, latencies are nanoseconds (`latency_ns`), sizes are bytes,
//! and a queue depth is `queue_depth`.

use serde::Serialize;

/// The schema id every document carries; a change that breaks a reader bumps the number.
pub const SCHEMA: &str = "ubdirect/1";

/// A document: the envelope's fields, then the subcommand's own.
#[derive(Serialize)]
pub struct Envelope<'a, T: Serialize> {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// The subcommand ("perf", "pipeline", "log smart", ...).
    pub command: &'a str,
    /// The subcommand's fields, at the top level.
    #[serde(flatten)]
    pub body: T,
}

/// The document for `command` with `body`'s fields, as a JSON value.
#[cfg(test)]
pub fn document<T: Serialize>(command: &str, body: T) -> serde_json::Result<serde_json::Value> {
    serde_json::to_value(Envelope {
        schema: SCHEMA,
        command,
        body,
    })
}

/// Print the document for `command` on stdout, pretty-printed.
pub fn print<T: Serialize>(command: &str, body: T) -> serde_json::Result<()> {
    // Serialized from the struct, not a `Value`, to keep the envelope's fields first.
    let doc = Envelope {
        schema: SCHEMA,
        command,
        body,
    };
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// Latency figures in nanoseconds (the fields a subcommand cannot measure are left out).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LatencyNs {
    /// Samples.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Mean.
    pub mean: f64,
    /// Minimum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// 99.99th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p9999: Option<f64>,
    /// Standard deviation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stddev: Option<f64>,
    /// Maximum.
    pub max: f64,
}

/// The JSON Schema in `docs/json.md` (the first ```json block of that file).
#[cfg(test)]
pub fn schema_from_doc() -> serde_json::Value {
    let doc = include_str!("../../docs/json.md");
    let start = doc
        .find("```json\n")
        .expect("docs/json.md has a ```json block")
        + 8;
    let end = start + doc[start..].find("\n```").expect("the block ends");
    serde_json::from_str(&doc[start..end]).expect("the schema in docs/json.md is JSON")
}

/// Validate `doc` against the documented schema; the errors as text.
#[cfg(test)]
pub fn validate(doc: &serde_json::Value) -> Result<(), String> {
    let schema = schema_from_doc();
    let v = jsonschema::validator_for(&schema).map_err(|e| format!("bad schema: {e}"))?;
    let errs: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_flattens_the_body() {
        #[derive(Serialize)]
        struct B {
            devices: Vec<u32>,
        }
        let v = document("devices", B { devices: vec![] }).unwrap();
        assert_eq!(v["schema"], "ubdirect/1");
        assert_eq!(v["command"], "devices");
        assert!(v["devices"].is_array());
        validate(&v).unwrap();
    }

    #[test]
    fn the_schema_rejects_what_it_should() {
        let bad = [
            serde_json::json!({"schema": "ubdirect/0", "command": "devices", "devices": []}),
            serde_json::json!({"schema": "ubdirect/1", "command": "devices"}),
            serde_json::json!({"schema": "ubdirect/1", "command": "nope"}),
            serde_json::json!({"schema": "ubdirect/1", "command": "perf", "qd": 4}),
        ];
        for b in bad {
            assert!(validate(&b).is_err(), "accepted {b}");
        }
    }
}
