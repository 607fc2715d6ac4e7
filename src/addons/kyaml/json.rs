//! go-yaml's values to JSON (sigs.k8s.io/yaml `convertToJSONableObject`, Go `json.Marshal`)
//! and back into a client's object (apimachinery `pkg/util/json`: int64 when the text is an
//! integer that fits, float64 otherwise).

use serde_json::{Map, Number, Value};

use super::ValueError;
use super::decode::Y;
use super::gostd::go_format_g32;

/// A decoded value as the client holds it after the JSON round trip.
pub(super) fn json_of(v: Y) -> Result<Value, ValueError> {
    Ok(match v {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Str(s) => Value::String(s),
        Y::Int(i) => Value::Number(i.into()),
        // Written as an integer beyond int64; read back as float64.
        Y::Uint(u) => Number::from_f64(u as f64).map_or(Value::Null, Value::Number),
        Y::Float(f) => float_json(f)?,
        Y::Seq(items) => Value::Array(items.into_iter().map(json_of).collect::<Result<_, _>>()?),
        Y::Map(pairs) => {
            let mut m = Map::new();
            for (k, v) in pairs {
                m.insert(key_string(&k)?, json_of(v)?);
            }
            Value::Object(m)
        }
    })
}

/// A float64 as the client ends up holding it: Go's encoder writes an integral value below
/// 1e21 without a fraction (`1e3` -> `1000`), which reads back as an int64 when it fits;
/// NaN and the infinities cannot be encoded at all.
fn float_json(f: f64) -> Result<Value, ValueError> {
    if !f.is_finite() {
        let name = if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        };
        return Err(ValueError::NotFinite(name));
    }
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.fract() == 0.0 && f.abs() < 1e21 && (-TWO_63..TWO_63).contains(&f) {
        return Ok(Value::Number((f as i64).into()));
    }
    Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
}

/// A map key as `convertToJSONableObject` writes it: strings as they are, ints in decimal,
/// floats as Go's `FormatFloat(k, 'g', -1, 32)` (with `.inf`, `-.inf`, `.nan`), booleans as
/// `true`/`false`; a null or a uint64 key is an error there.
fn key_string(k: &Y) -> Result<String, ValueError> {
    match k {
        Y::Str(s) => Ok(s.clone()),
        Y::Int(i) => Ok(i.to_string()),
        Y::Bool(b) => Ok(b.to_string()),
        Y::Float(f) => Ok(go_format_g32(*f)),
        Y::Null => Err(ValueError::NullKey),
        Y::Uint(u) => Err(ValueError::UintKey(*u)),
        Y::Seq(_) | Y::Map(_) => Err(ValueError::InvalidKey),
    }
}

/// JSON numbers as apimachinery's decoder keeps them and Go's encoder writes them back
/// (see [`float_json`]): an integer that fits int64 stays one, anything else is a float64.
pub(super) fn client_numbers(v: Value) -> Result<Value, ValueError> {
    Ok(match v {
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::Number(i.into()),
            (None, Some(f)) => float_json(f)?,
            (None, None) => Value::Number(n),
        },
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(client_numbers)
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| Ok((k, client_numbers(v)?)))
                .collect::<Result<_, ValueError>>()?,
        ),
        other => other,
    })
}
