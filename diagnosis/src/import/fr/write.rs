//! Writing dumps the way PyTorch writes them, so that the simulator's dumps exercise the same
//! reader as real ones (and PyTorch's own `torchfrtrace` can read ours).

use super::{ranks_str, FrDump, FrEntry};
use crate::import::ImportError;
use serde_json::json;
use serde_pickle::{HashableValue, SerOptions, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Writes `dump` as PyTorch's pickle variant: a protocol 2 pickle of a dict with string keys,
/// `process_group` as a tuple, missing times as `None`, `pg_config` ranks as a string. It also
/// stores a `rank` key (see the module docs).
pub fn write_pickle(dump: &FrDump, path: &Path) -> Result<(), ImportError> {
    let bytes = serde_pickle::value_to_vec(&pickle_value(dump), SerOptions::new().proto_v2())
        .map_err(|e| ImportError::Pickle {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    write_file(path, &bytes)
}

/// Writes `dump` as PyTorch's JSON variant (`dump_json`): `pg_status` numbers and `pg_config`
/// ranks as strings, a missing discovery time as `0`. Unlike PyTorch it always writes
/// `entries`, also when empty.
pub fn write_json(dump: &FrDump, path: &Path) -> Result<(), ImportError> {
    let pg_config: serde_json::Map<String, serde_json::Value> = dump
        .pg_config
        .iter()
        .map(|(key, pg)| {
            let v = json!({"name": pg.name, "desc": pg.desc, "ranks": ranks_str(&pg.ranks)});
            (key.clone(), v)
        })
        .collect();
    let pg_status: serde_json::Map<String, serde_json::Value> = dump
        .pg_status
        .iter()
        .map(|(key, s)| {
            let v = json!({
                "last_enqueued_collective": s.last_enqueued_collective.to_string(),
                "last_started_collective": s.last_started_collective.to_string(),
                "last_completed_collective": s.last_completed_collective.to_string(),
            });
            (key.clone(), v)
        })
        .collect();
    let entries: Vec<serde_json::Value> = dump.entries.iter().map(json_entry).collect();
    let doc = json!({
        "version": dump.version,
        "rank": dump.rank,
        "pg_config": pg_config,
        "pg_status": pg_status,
        "entries": entries,
    });
    let bytes = serde_json::to_vec(&doc).map_err(|e| ImportError::Json {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    write_file(path, &bytes)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ImportError> {
    std::fs::write(path, bytes).map_err(|source| ImportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn json_entry(e: &FrEntry) -> serde_json::Value {
    let mut v = json!({
        "record_id": e.record_id,
        "pg_id": e.pg_id,
        "process_group": [e.process_group.0, e.process_group.1],
        "collective_seq_id": e.collective_seq_id,
        "p2p_seq_id": e.p2p_seq_id,
        "op_id": e.op_id,
        "profiling_name": e.profiling_name,
        "time_created_ns": e.time_created_ns,
        "input_sizes": e.input_sizes,
        "input_dtypes": e.input_dtypes,
        "output_sizes": e.output_sizes,
        "output_dtypes": e.output_dtypes,
        "state": e.state,
        "time_discovered_started_ns": e.time_discovered_started_ns.unwrap_or(0),
        "time_discovered_completed_ns": e.time_discovered_completed_ns.unwrap_or(0),
        "retired": e.retired,
        "timeout_ms": e.timeout_ms,
        "is_p2p": e.is_p2p,
        "thread_name": "",
        "thread_id": "",
    });
    if let (Some(d), Some(obj)) = (e.duration_ms, v.as_object_mut()) {
        obj.insert("duration_ms".into(), json!(d));
    }
    v
}

fn pickle_value(dump: &FrDump) -> Value {
    let pg_config = dump
        .pg_config
        .iter()
        .map(|(key, pg)| {
            let v = dict([
                ("name", s(&pg.name)),
                ("desc", s(&pg.desc)),
                ("ranks", Value::String(ranks_str(&pg.ranks))),
            ]);
            (HashableValue::String(key.clone()), v)
        })
        .collect();
    let pg_status = dump
        .pg_status
        .iter()
        .map(|(key, st)| {
            let v = dict([
                (
                    "last_enqueued_collective",
                    Value::I64(st.last_enqueued_collective),
                ),
                (
                    "last_started_collective",
                    Value::I64(st.last_started_collective),
                ),
                (
                    "last_completed_collective",
                    Value::I64(st.last_completed_collective),
                ),
            ]);
            (HashableValue::String(key.clone()), v)
        })
        .collect();
    dict([
        ("version", s(&dump.version)),
        ("rank", Value::I64(i64::from(dump.rank))),
        ("pg_config", Value::Dict(pg_config)),
        ("pg_status", Value::Dict(pg_status)),
        ("comm_lib_version", s("")),
        (
            "entries",
            Value::List(dump.entries.iter().map(pickle_entry).collect()),
        ),
    ])
}

fn pickle_entry(e: &FrEntry) -> Value {
    let time = |t: Option<u64>| t.map_or(Value::None, u);
    let sizes = |sz: &[Vec<i64>]| {
        Value::List(
            sz.iter()
                .map(|dims| Value::List(dims.iter().map(|&d| Value::I64(d)).collect()))
                .collect(),
        )
    };
    let strings = |v: &[String]| Value::List(v.iter().map(|x| s(x)).collect());
    let mut fields = vec![
        ("record_id", u(e.record_id)),
        ("pg_id", u(e.pg_id)),
        (
            "process_group",
            Value::Tuple(vec![s(&e.process_group.0), s(&e.process_group.1)]),
        ),
        ("thread_name", s("")),
        ("thread_id", s("")),
        ("collective_seq_id", u(e.collective_seq_id)),
        ("p2p_seq_id", u(e.p2p_seq_id)),
        ("op_id", u(e.op_id)),
        ("profiling_name", s(&e.profiling_name)),
        ("time_created_ns", u(e.time_created_ns)),
        ("input_sizes", sizes(&e.input_sizes)),
        ("input_dtypes", strings(&e.input_dtypes)),
        ("output_sizes", sizes(&e.output_sizes)),
        ("output_dtypes", strings(&e.output_dtypes)),
        ("state", s(&e.state)),
        (
            "time_discovered_started_ns",
            time(e.time_discovered_started_ns),
        ),
        (
            "time_discovered_completed_ns",
            time(e.time_discovered_completed_ns),
        ),
        ("retired", Value::Bool(e.retired)),
        ("timeout_ms", u(e.timeout_ms)),
        ("is_p2p", Value::Bool(e.is_p2p)),
        ("frames", Value::List(Vec::new())),
    ];
    if let Some(d) = e.duration_ms {
        fields.push(("duration_ms", Value::F64(d)));
    }
    dict(fields)
}

fn dict<'a>(fields: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    let map: BTreeMap<HashableValue, Value> = fields
        .into_iter()
        .map(|(k, v)| (HashableValue::String(k.to_string()), v))
        .collect();
    Value::Dict(map)
}

fn s(text: &str) -> Value {
    Value::String(text.to_string())
}

/// PyTorch writes every counter as a signed 64-bit integer; values past `i64::MAX` (never seen
/// in practice) are written as Python's unbounded integers.
fn u(n: u64) -> Value {
    match i64::try_from(n) {
        Ok(i) => Value::I64(i),
        Err(_) => Value::Int(n.into()),
    }
}
