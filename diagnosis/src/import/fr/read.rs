//! Reading one dump, pickle or JSON, into an [`FrDump`].
//!
//! Both formats are first decoded into a `serde_json::Value` tree (a pickle's tuples and sets
//! become arrays, integer dict keys become strings), so the field checks below are written
//! once and every wrong type produces the same kind of message naming the file, the entry and
//! the field.

use super::{FrDump, FrEntry, FrPg, FrPgStatus, STATE_COMPLETED, STATE_SCHEDULED, STATE_STARTED};
use crate::event::Rank;
use crate::import::ImportError;
use serde_json::{Map, Number, Value};
use serde_pickle::{DeOptions, ErrorCode, HashableValue};
use std::collections::BTreeMap;
use std::path::Path;

/// How deep a pickle may nest before we refuse it (FR dumps nest four levels; the limit keeps a
/// hostile file from exhausting the stack during conversion).
const MAX_DEPTH: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Pickle,
    Json,
}

/// Reads one dump, telling pickle (it starts with the protocol 2+ marker `0x80`) from JSON (it
/// starts with `{`) by content, not by name. See the module docs for where the rank comes from.
pub fn read_dump(path: &Path) -> Result<FrDump, ImportError> {
    let bytes = std::fs::read(path).map_err(|source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_dump(path, &bytes)
}

/// [`read_dump`] on bytes already read; `path` names them in errors and gives the rank.
pub(crate) fn parse_dump(path: &Path, bytes: &[u8]) -> Result<FrDump, ImportError> {
    let (format, doc) = decode(path, bytes)?;
    let Value::Object(doc) = doc else {
        return Err(ImportError::NotADict {
            path: path.to_path_buf(),
            found: kind(&doc),
        });
    };
    let fields = Fields { path };
    let version = match doc.get("version") {
        None => return Err(missing(path, "version")),
        Some(Value::String(v)) => v.clone(),
        Some(_) => return Err(ImportError::invalid(path, "field version is not a string")),
    };
    check_version(path, &version)?;
    let rank = resolve_rank(path, &fields, &doc)?;
    let pg_config = match doc.get("pg_config") {
        None => BTreeMap::new(),
        Some(v) => fields.pg_config(v)?,
    };
    let pg_status = match doc.get("pg_status") {
        None => BTreeMap::new(),
        Some(v) => fields.pg_status(v)?,
    };
    let entries = match (doc.get("entries"), format) {
        // PyTorch's JSON writer leaves `entries` out when the buffer is empty.
        (None, Format::Json) => Vec::new(),
        (None, Format::Pickle) => return Err(missing(path, "entries")),
        (Some(Value::Array(list)), _) => list
            .iter()
            .enumerate()
            .map(|(i, e)| fields.entry(i, e))
            .collect::<Result<_, _>>()?,
        (Some(_), _) => return Err(ImportError::invalid(path, "field entries is not a list")),
    };
    Ok(FrDump {
        rank,
        version,
        pg_config,
        pg_status,
        entries,
    })
}

fn decode(path: &Path, bytes: &[u8]) -> Result<(Format, Value), ImportError> {
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    match (bytes.first(), first) {
        (Some(0x80), _) => {
            let opts = DeOptions::new().replace_unresolved_globals();
            // serde-pickle 1.2 miscounts references to values inside a container that the
            // pickle shares (memoizes and fetches again), and then reports a "recursive
            // structure" (birkenfeld/serde-pickle PR #24). PyTorch shares exactly one kind of
            // container between entries: the stack-frame dicts in `frames`, which we ignore.
            // So on that error we decode again with the lost references read as `None`; should
            // one of them be a field we use, the field checks below reject it by name.
            let value = serde_pickle::value_from_slice(bytes, opts.clone())
                .or_else(|e| match e {
                    serde_pickle::Error::Syntax(ErrorCode::Recursive) => {
                        serde_pickle::value_from_slice(bytes, opts.replace_recursive_structures())
                    }
                    other => Err(other),
                })
                .map_err(|e| match e {
                    serde_pickle::Error::Eval(ErrorCode::EOFWhileParsing, _)
                    | serde_pickle::Error::Syntax(ErrorCode::EOFWhileParsing) => {
                        ImportError::TruncatedPickle {
                            path: path.to_path_buf(),
                        }
                    }
                    serde_pickle::Error::Io(io)
                        if io.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        ImportError::TruncatedPickle {
                            path: path.to_path_buf(),
                        }
                    }
                    other => ImportError::Pickle {
                        path: path.to_path_buf(),
                        detail: other.to_string(),
                    },
                })?;
            Ok((Format::Pickle, pickle_to_json(path, value, 0)?))
        }
        (_, Some(b'{' | b'[')) => {
            let value = serde_json::from_slice(bytes).map_err(|e| ImportError::Json {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
            Ok((Format::Json, value))
        }
        _ => Err(ImportError::UnknownFormat {
            path: path.to_path_buf(),
        }),
    }
}

fn pickle_to_json(path: &Path, v: serde_pickle::Value, depth: usize) -> Result<Value, ImportError> {
    use serde_pickle::Value as P;
    if depth > MAX_DEPTH {
        return Err(ImportError::Pickle {
            path: path.to_path_buf(),
            detail: format!("nested deeper than {MAX_DEPTH} levels"),
        });
    }
    let list = |items: Vec<P>| -> Result<Value, ImportError> {
        items
            .into_iter()
            .map(|x| pickle_to_json(path, x, depth + 1))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array)
    };
    Ok(match v {
        P::None => Value::Null,
        P::Bool(b) => Value::Bool(b),
        P::I64(i) => Value::Number(i.into()),
        P::Int(big) => big_int(&big.to_string()),
        P::F64(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        P::Bytes(b) => Value::String(String::from_utf8_lossy(&b).into_owned()),
        P::String(s) => Value::String(s),
        P::List(items) | P::Tuple(items) => list(items)?,
        P::Set(items) | P::FrozenSet(items) => {
            list(items.into_iter().map(HashableValue::into_value).collect())?
        }
        P::Dict(map) => {
            let mut obj = Map::new();
            for (k, v) in map {
                // Stack frames are not used, and are where lost references land (see `decode`).
                if matches!(&k, HashableValue::String(s) if s == "frames") {
                    continue;
                }
                let key = match k {
                    HashableValue::String(s) => s,
                    HashableValue::I64(i) => i.to_string(),
                    HashableValue::Int(i) => i.to_string(),
                    _ => {
                        return Err(ImportError::Pickle {
                            path: path.to_path_buf(),
                            detail: "a dict key is neither a string nor an integer".into(),
                        })
                    }
                };
                obj.insert(key, pickle_to_json(path, v, depth + 1)?);
            }
            Value::Object(obj)
        }
    })
}

/// Python's unbounded integers: kept exact when they fit a `u64`, else approximated (a field
/// that needs an integer then reports it as out of range).
fn big_int(decimal: &str) -> Value {
    if let Ok(n) = decimal.parse::<u64>() {
        return Value::Number(n.into());
    }
    decimal
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "None",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a dict",
    }
}

fn missing(path: &Path, key: &str) -> ImportError {
    ImportError::MissingKey {
        path: path.to_path_buf(),
        key: key.to_string(),
    }
}

fn check_version(path: &Path, version: &str) -> Result<(), ImportError> {
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.trim().parse::<u32>().ok());
    if major == Some(2) {
        Ok(())
    } else {
        Err(ImportError::UnsupportedVersion {
            path: path.to_path_buf(),
            version: version.to_string(),
        })
    }
}

/// The rank in the file name: the digits at its end, after dropping a dump extension.
pub(crate) fn rank_from_file_name(path: &Path) -> Option<Rank> {
    let name = path.file_name()?.to_str()?;
    let stem = [".json", ".pkl", ".pickle"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .unwrap_or(name);
    let digits_at = stem
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_digit())
        .last()
        .map(|(i, _)| i)?;
    stem[digits_at..].parse().ok()
}

fn resolve_rank(
    path: &Path,
    fields: &Fields,
    doc: &Map<String, Value>,
) -> Result<Rank, ImportError> {
    let from_key = match doc.get("rank") {
        None | Some(Value::Null) => None,
        Some(v) => Some(fields.rank(v, "field rank")?),
    };
    match (rank_from_file_name(path), from_key) {
        (Some(a), Some(b)) if a != b => Err(ImportError::invalid(
            path,
            format!("the file name says rank {a} but the rank key says {b}"),
        )),
        (Some(r), _) | (None, Some(r)) => Ok(r),
        (None, None) => Err(ImportError::NoRank {
            path: path.to_path_buf(),
        }),
    }
}

/// Typed access to the decoded tree; every failure names the file and the place.
struct Fields<'a> {
    path: &'a Path,
}

impl Fields<'_> {
    fn err(&self, place: &str, what: &str) -> ImportError {
        ImportError::invalid(self.path, format!("{place} {what}"))
    }

    /// An integer, or a decimal string holding one (the JSON variant writes some as strings).
    fn int(&self, v: &Value, place: &str) -> Result<i64, ImportError> {
        let n = match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        n.ok_or_else(|| self.err(place, "is not an integer"))
    }

    fn uint(&self, v: &Value, place: &str) -> Result<u64, ImportError> {
        if v.as_i64().is_some_and(|n| n < 0) {
            return Err(self.err(place, "is negative"));
        }
        let n = match v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        n.ok_or_else(|| self.err(place, "is not an integer"))
    }

    fn rank(&self, v: &Value, place: &str) -> Result<Rank, ImportError> {
        let n = self.uint(v, place)?;
        Rank::try_from(n).map_err(|_| self.err(place, "is out of the rank range"))
    }

    fn string(&self, v: &Value, place: &str) -> Result<String, ImportError> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| self.err(place, "is not a string"))
    }

    fn boolean(&self, v: &Value, place: &str) -> Result<bool, ImportError> {
        v.as_bool().ok_or_else(|| self.err(place, "is not a bool"))
    }

    fn object<'v>(&self, v: &'v Value, place: &str) -> Result<&'v Map<String, Value>, ImportError> {
        v.as_object()
            .ok_or_else(|| self.err(place, "is not a dict"))
    }

    fn list<'v>(&self, v: &'v Value, place: &str) -> Result<&'v [Value], ImportError> {
        v.as_array()
            .map(Vec::as_slice)
            .ok_or_else(|| self.err(place, "is not a list"))
    }

    /// `pg_config` ranks: PyTorch writes the string `"[0, 1, 2]"`; a list is accepted too.
    fn ranks(&self, v: &Value, place: &str) -> Result<Vec<Rank>, ImportError> {
        match v {
            Value::Array(items) => items.iter().map(|r| self.rank(r, place)).collect(),
            Value::String(s) => {
                let inner = s
                    .trim()
                    .strip_prefix('[')
                    .and_then(|x| x.strip_suffix(']'))
                    .ok_or_else(|| self.err(place, "is not a list of ranks"))?;
                inner
                    .split(',')
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(|x| {
                        x.parse::<Rank>()
                            .map_err(|_| self.err(place, "is not a list of ranks"))
                    })
                    .collect()
            }
            _ => Err(self.err(place, "is not a list of ranks")),
        }
    }

    fn pg_config(&self, v: &Value) -> Result<BTreeMap<String, FrPg>, ImportError> {
        let mut out = BTreeMap::new();
        for (key, pg) in self.object(v, "field pg_config")? {
            let place = format!("pg_config {key}");
            let pg = self.object(pg, &place)?;
            let name = match pg.get("name") {
                Some(n) => self.string(n, &format!("{place} field name"))?,
                None => key.clone(),
            };
            let desc = match pg.get("desc") {
                Some(d) => self.string(d, &format!("{place} field desc"))?,
                None => String::new(),
            };
            let ranks = match pg.get("ranks") {
                Some(r) => self.ranks(r, &format!("{place} field ranks"))?,
                None => return Err(self.err(&place, "has no field ranks")),
            };
            out.insert(key.clone(), FrPg { name, desc, ranks });
        }
        Ok(out)
    }

    fn pg_status(&self, v: &Value) -> Result<BTreeMap<String, FrPgStatus>, ImportError> {
        let mut out = BTreeMap::new();
        for (key, st) in self.object(v, "field pg_status")? {
            let place = format!("pg_status {key}");
            let st = self.object(st, &place)?;
            let get = |field: &str| -> Result<i64, ImportError> {
                let place = format!("{place} field {field}");
                match st.get(field) {
                    Some(x) => self.int(x, &place),
                    None => Ok(-1),
                }
            };
            out.insert(
                key.clone(),
                FrPgStatus {
                    last_enqueued_collective: get("last_enqueued_collective")?,
                    last_started_collective: get("last_started_collective")?,
                    last_completed_collective: get("last_completed_collective")?,
                },
            );
        }
        Ok(out)
    }

    fn entry(&self, index: usize, v: &Value) -> Result<FrEntry, ImportError> {
        let here = format!("entry {index}");
        let e = self.object(v, &here)?;
        let place = |field: &str| format!("{here} field {field}");
        let required = |field: &str| -> Result<&Value, ImportError> {
            e.get(field)
                .ok_or_else(|| self.err(&here, &format!("has no field {field}")))
        };
        let uint_or = |field: &str, default: u64| -> Result<u64, ImportError> {
            match e.get(field) {
                Some(x) => self.uint(x, &place(field)),
                None => Ok(default),
            }
        };
        let bool_or = |field: &str| -> Result<bool, ImportError> {
            match e.get(field) {
                Some(x) => self.boolean(x, &place(field)),
                None => Ok(false),
            }
        };
        // Discovery times: `None` in the pickle, `0` in the JSON variant, absent in old dumps.
        let time = |field: &str| -> Result<Option<u64>, ImportError> {
            match e.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => Ok(Some(self.uint(x, &place(field))?).filter(|&t| t != 0)),
            }
        };
        let sizes = |field: &str| -> Result<Vec<Vec<i64>>, ImportError> {
            let p = place(field);
            self.list(required(field)?, &p)?
                .iter()
                .map(|dims| {
                    self.list(dims, &p)?
                        .iter()
                        .map(|d| self.int(d, &p))
                        .collect::<Result<Vec<_>, _>>()
                })
                .collect()
        };
        let strings = |field: &str| -> Result<Vec<String>, ImportError> {
            let p = place(field);
            self.list(required(field)?, &p)?
                .iter()
                .map(|s| self.string(s, &p))
                .collect()
        };

        let process_group = {
            let p = place("process_group");
            match self.list(required("process_group")?, &p)? {
                [name, desc] => (self.string(name, &p)?, self.string(desc, &p)?),
                _ => return Err(self.err(&p, "is not a (name, desc) pair")),
            }
        };
        // FR versions before 2.4 called the collective counter `seq_id`.
        let collective_seq_id = match (e.get("collective_seq_id"), e.get("seq_id")) {
            (Some(x), _) | (None, Some(x)) => self.uint(x, &place("collective_seq_id"))?,
            (None, None) => return Err(self.err(&here, "has no field collective_seq_id")),
        };
        let state = self.string(required("state")?, &place("state"))?;
        if ![STATE_SCHEDULED, STATE_STARTED, STATE_COMPLETED].contains(&state.as_str()) {
            return Err(self.err(
                &place("state"),
                "is not one of scheduled, started, completed",
            ));
        }
        let duration_ms = match e.get("duration_ms") {
            None | Some(Value::Null) => None,
            Some(x) => Some(
                x.as_f64()
                    .ok_or_else(|| self.err(&place("duration_ms"), "is not a number"))?,
            ),
        };
        Ok(FrEntry {
            record_id: self.uint(required("record_id")?, &place("record_id"))?,
            pg_id: self.uint(required("pg_id")?, &place("pg_id"))?,
            process_group,
            collective_seq_id,
            p2p_seq_id: uint_or("p2p_seq_id", 0)?,
            op_id: uint_or("op_id", 0)?,
            profiling_name: self.string(required("profiling_name")?, &place("profiling_name"))?,
            time_created_ns: self.uint(required("time_created_ns")?, &place("time_created_ns"))?,
            time_discovered_started_ns: time("time_discovered_started_ns")?,
            time_discovered_completed_ns: time("time_discovered_completed_ns")?,
            input_sizes: sizes("input_sizes")?,
            input_dtypes: strings("input_dtypes")?,
            output_sizes: sizes("output_sizes")?,
            output_dtypes: strings("output_dtypes")?,
            state,
            retired: bool_or("retired")?,
            timeout_ms: uint_or("timeout_ms", 0)?,
            duration_ms,
            is_p2p: bool_or("is_p2p")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_comes_from_trailing_digits_of_the_file_name() {
        assert_eq!(
            rank_from_file_name(Path::new("/d/nccl_trace_rank_3")),
            Some(3)
        );
        assert_eq!(rank_from_file_name(Path::new("rank_12.json")), Some(12));
        assert_eq!(rank_from_file_name(Path::new("dump7.pkl")), Some(7));
        assert_eq!(rank_from_file_name(Path::new("dump.json")), None);
        assert_eq!(rank_from_file_name(Path::new("README")), None);
    }

    #[test]
    fn versions_of_major_two_are_accepted() {
        for v in ["2.4", "2.7", "2.10"] {
            assert!(check_version(Path::new("f"), v).is_ok(), "{v}");
        }
        for v in ["1.0", "3.1", "abc", ""] {
            assert!(check_version(Path::new("f"), v).is_err(), "{v}");
        }
    }
}
