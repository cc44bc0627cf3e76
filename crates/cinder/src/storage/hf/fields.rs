//! Reading `config.json`: typed fields with the architecture's defaults, errors naming the
//! file and the field.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::HfError;

/// A `config.json`, read.
pub(super) struct Fields {
    path: PathBuf,
    value: Value,
}

impl Fields {
    pub(super) fn read(path: &Path) -> Result<Fields, HfError> {
        let text = fs::read_to_string(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => HfError::Missing(path.to_path_buf()),
            _ => HfError::Read {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let value = serde_json::from_str(&text).map_err(|e| HfError::Damaged {
            path: path.to_path_buf(),
            reason: format!("not valid JSON ({e})"),
        })?;
        Ok(Fields {
            path: path.to_path_buf(),
            value,
        })
    }

    /// `field` of this file is `value`, where cinder supports `allowed`.
    pub(super) fn unsupported(&self, field: &'static str, value: String, allowed: &str) -> HfError {
        HfError::Unsupported {
            path: self.path.clone(),
            field,
            value,
            allowed: allowed.into(),
        }
    }

    /// The raw value of `field`, if present.
    pub(super) fn raw(&self, field: &str) -> Option<&Value> {
        self.value.get(field)
    }

    /// `field` read by `read`; absent or `null`, `default`.
    fn get<T>(
        &self,
        field: &'static str,
        default: T,
        read: impl Fn(&Value) -> Option<T>,
        kind: &str,
    ) -> Result<T, HfError> {
        match self.value.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => read(v).ok_or_else(|| self.damaged(field, v, kind)),
        }
    }

    fn damaged(&self, field: &str, v: &Value, kind: &str) -> HfError {
        HfError::Damaged {
            path: self.path.clone(),
            reason: format!("`{field}` is {v}, but it must be {kind}"),
        }
    }

    pub(super) fn usize(&self, field: &'static str, default: usize) -> Result<usize, HfError> {
        self.get(
            field,
            default,
            |v| v.as_u64().map(|n| n as usize),
            "a whole number",
        )
    }

    pub(super) fn f64(&self, field: &'static str, default: f64) -> Result<f64, HfError> {
        self.get(field, default, Value::as_f64, "a number")
    }

    /// A number that `null` turns off: absent, `default`; `null`, `None`.
    pub(super) fn nullable_f64(
        &self,
        field: &'static str,
        default: Option<f64>,
    ) -> Result<Option<f64>, HfError> {
        match self.value.get(field) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.damaged(field, v, "a number or null")),
        }
    }

    pub(super) fn bool(&self, field: &'static str, default: bool) -> Result<bool, HfError> {
        self.get(field, default, Value::as_bool, "true or false")
    }

    pub(super) fn string(&self, field: &'static str, default: &str) -> Result<String, HfError> {
        let read = |v: &Value| v.as_str().map(str::to_string);
        self.get(field, default.to_string(), read, "a string")
    }

    /// The object `field` (absent or `null`: empty) as fields of their own, named
    /// `field.key` in errors.
    pub(super) fn object(&self, field: &'static str) -> Result<Fields, HfError> {
        let value = match self.value.get(field) {
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => return Err(self.damaged(field, v, "an object")),
        };
        Ok(Fields {
            path: self.path.clone(),
            value,
        })
    }
}
