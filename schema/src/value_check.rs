//! Generic checks over `serde_json::Value`, one per kind of value, for configs, stored
//! guardrails and stored providers. Each takes the JSON path of the value it checks, so every
//! error (`ConfigError`) names exactly where the problem is.

use crate::errors::GatewayError;
pub use crate::json_check::shorten;
use crate::json_check::{self, each_item, join, kind_of};
use crate::wire_names::is_header_value;
use serde_json::{Map, Value};
use std::fmt::{self, Display};

/// Why a config was rejected, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// JSON path of the value at fault, e.g. `targets[1].cb_config.cooldown_interval`;
    /// empty for the root.
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError { path: path.into(), message: message.into() }
    }

    /// A 400 whose `param` is the path at fault (the root: the header every config comes by).
    pub fn to_gateway_error(&self) -> GatewayError {
        let param = if self.path.is_empty() { "x-gateway-config" } else { self.path.as_str() };
        GatewayError::invalid_param(param, self.to_string()).with_code("invalid_config")
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "invalid config: {}", self.message)
        } else {
            write!(f, "invalid config at `{}`: {}", self.path, self.message)
        }
    }
}

/// Wrong JSON type. `null` is a wrong type too: an optional property is left out, not null.
pub fn expected(path: &str, what: &str, v: &Value) -> ConfigError {
    ConfigError::new(path, format!("must be {what}, got {}", kind_of(v)))
}

pub fn string(v: &Value, path: &str) -> Result<String, ConfigError> {
    v.as_str().map(str::to_string).ok_or_else(|| expected(path, "a string", v))
}

/// A string the gateway sends upstream in a header (a key, a vendor id, a session token). The
/// value is never echoed: it may be a secret.
pub fn header_text(v: &Value, path: &str) -> Result<String, ConfigError> {
    let text = string(v, path)?;
    if is_header_value(&text) {
        Ok(text)
    } else {
        Err(ConfigError::new(
            path,
            "must not contain control characters such as CR, LF or NUL: it is sent in an HTTP header",
        ))
    }
}

pub fn boolean(v: &Value, path: &str) -> Result<bool, ConfigError> {
    v.as_bool().ok_or_else(|| expected(path, "a boolean", v))
}

pub fn number(v: &Value, path: &str) -> Result<f64, ConfigError> {
    let n = v.as_f64().ok_or_else(|| expected(path, "a number", v))?;
    // serde_json only yields non-finite values with `arbitrary_precision` (e.g. 1e400), but
    // a feature elsewhere in the build could turn that on.
    if n.is_finite() {
        Ok(n)
    } else {
        Err(ConfigError::new(path, "must be a finite number"))
    }
}

pub fn object(v: &Value, path: &str) -> Result<Map<String, Value>, ConfigError> {
    v.as_object().cloned().ok_or_else(|| expected(path, "an object", v))
}

/// An unsigned integer within `min..=max`. JSON has a single number type, so `5.0` counts
/// as 5 while `5.5` is rejected; anything beyond the target type is "too large".
pub fn integer<T>(v: &Value, path: &str, min: T, max: T) -> Result<T, ConfigError>
where
    T: Copy + Display + Into<u64> + TryFrom<u64>,
{
    // The smallest float that no longer fits in a u64.
    const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
    let Value::Number(n) = v else {
        return Err(expected(path, "an integer", v));
    };
    let below = || ConfigError::new(path, format!("must be at least {min}"));
    let above = || ConfigError::new(path, format!("must be at most {max}"));
    let whole = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => u,
        (None, Some(f)) if f.fract() != 0.0 => return Err(ConfigError::new(path, "must be an integer")),
        (None, Some(f)) if f < 0.0 => return Err(below()),
        // In range, so the cast is exact up to float precision and cannot saturate.
        (None, Some(f)) if f < TWO_POW_64 => f as u64,
        _ => return Err(above()),
    };
    if whole < min.into() {
        return Err(below());
    }
    if whole > max.into() {
        return Err(above());
    }
    T::try_from(whole).map_err(|_| above())
}

/// An HTTP status code, as used in the `*_status_codes` lists.
pub fn status_code(v: &Value, path: &str) -> Result<u16, ConfigError> {
    integer(v, path, 100, 599)
}

pub fn status_codes(v: &Value, path: &str) -> Result<Vec<u16>, ConfigError> {
    array_of(v, path, status_code)
}

pub fn array_of<T>(
    v: &Value,
    path: &str,
    item: impl Fn(&Value, &str) -> Result<T, ConfigError>,
) -> Result<Vec<T>, ConfigError> {
    let items = v.as_array().ok_or_else(|| expected(path, "an array", v))?;
    each_item(items, path, item)
}

/// A string naming one of `variants`; `name` gives each variant's JSON spelling.
pub fn one_of<T: Copy>(v: &Value, path: &str, variants: &[T], name: fn(T) -> &'static str) -> Result<T, ConfigError> {
    let s = v.as_str().ok_or_else(|| expected(path, "a string", v))?;
    json_check::one_of(s, variants, name, "`")
        .map_err(|names| ConfigError::new(path, format!("must be one of {names}")))
}

/// A JSON object being read property by property.
pub struct Obj<'a> {
    pub map: &'a Map<String, Value>,
    pub path: &'a str,
}

impl<'a> Obj<'a> {
    /// An object whose properties are free (checked by the caller).
    pub fn open(v: &'a Value, path: &'a str) -> Result<Self, ConfigError> {
        let map = v.as_object().ok_or_else(|| expected(path, "an object", v))?;
        Ok(Obj { map, path })
    }

    /// An object whose properties must all be in `known`.
    pub fn new(v: &'a Value, path: &'a str, known: &[&str]) -> Result<Self, ConfigError> {
        let obj = Self::open(v, path)?;
        if let Some(key) = obj.map.keys().find(|k| !known.contains(&k.as_str())) {
            // The key is client text: cut it in the path as in the message.
            let key = shorten(key);
            return Err(ConfigError::new(join(path, &key), format!("unknown property `{key}`")));
        }
        Ok(obj)
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Path of property `key`, a name from the schema (client keys are cut with `shorten`).
    pub fn path(&self, key: &str) -> String {
        join(self.path, key)
    }

    pub fn opt<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&Value, &str) -> Result<T, ConfigError>,
    ) -> Result<Option<T>, ConfigError> {
        self.map.get(key).map(|v| parse(v, &self.path(key))).transpose()
    }

    pub fn req<T>(
        &self,
        key: &str,
        parse: impl FnOnce(&Value, &str) -> Result<T, ConfigError>,
    ) -> Result<T, ConfigError> {
        self.opt(key, parse)?.ok_or_else(|| ConfigError::new(self.path(key), "is required"))
    }

    /// An optional array; absent reads as empty.
    pub fn list<T>(
        &self,
        key: &str,
        item: impl Fn(&Value, &str) -> Result<T, ConfigError>,
    ) -> Result<Vec<T>, ConfigError> {
        Ok(self.opt(key, |v, p| array_of(v, p, item))?.unwrap_or_default())
    }
}
