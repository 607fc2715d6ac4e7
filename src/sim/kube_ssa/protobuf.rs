//! The slice of Kubernetes protobuf the double reads: a v1 Secret, as client-go (Helm's
//! release storage) sends one with `Content-Type: application/vnd.kubernetes.protobuf`.

use serde_json::{Value, json};

/// One protobuf field: number and value (varints as numbers, length-delimited as bytes).
enum PbValue<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// Why a protobuf body could not be read; the API server answers 400 with it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProtobufError {
    /// The body ends inside a varint.
    #[error("truncated varint")]
    TruncatedVarint,
    /// A varint longer than 64 bits.
    #[error("varint too long")]
    VarintTooLong,
    /// A length that does not fit in memory.
    #[error("length too large")]
    LengthTooLarge,
    /// A length-delimited field runs past the end of its message.
    #[error("field {num}: length {len} beyond the message")]
    BeyondMessage {
        /// The field number.
        num: u64,
        /// Its declared length.
        len: usize,
    },
    /// The body ends inside a fixed32 or fixed64.
    #[error("truncated fixed-width field")]
    TruncatedFixed,
    /// A wire type protobuf does not define (3 and 4, the deprecated groups, included).
    #[error("field {num}: unsupported wire type {wire}")]
    WireType {
        /// The field number.
        num: u64,
        /// Its wire type.
        wire: u64,
    },
    /// A string field that is not UTF-8.
    #[error("{0}")]
    NotUtf8(#[from] std::string::FromUtf8Error),
    /// A varint where a string belongs.
    #[error("expected a string")]
    NotAString,
    /// A varint where a map entry belongs.
    #[error("expected a map entry")]
    NotAMapEntry,
    /// The body does not start with `k8s\0`.
    #[error("no k8s protobuf magic")]
    NoMagic,
    /// The runtime.Unknown envelope has no `raw` field.
    #[error("no raw object in the envelope")]
    NoRaw,
    /// The Secret's `metadata` field is a varint.
    #[error("metadata is not a message")]
    MetadataNotMessage,
}

/// Reads one varint off the front of `b`.
fn varint(b: &mut &[u8]) -> Result<u64, ProtobufError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first().ok_or(ProtobufError::TruncatedVarint)?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ProtobufError::VarintTooLong)
}

/// Splits a protobuf message into its fields (wire types 0, 1, 2 and 5; 1 and 5 skipped).
fn pb_fields(mut b: &[u8]) -> Result<Vec<(u64, PbValue<'_>)>, ProtobufError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let tag = varint(&mut b)?;
        let (num, wire) = (tag >> 3, tag & 7);
        match wire {
            0 => out.push((num, PbValue::Varint(varint(&mut b)?))),
            2 => {
                let len =
                    usize::try_from(varint(&mut b)?).map_err(|_| ProtobufError::LengthTooLarge)?;
                if len > b.len() {
                    return Err(ProtobufError::BeyondMessage { num, len });
                }
                let (v, rest) = b.split_at(len);
                out.push((num, PbValue::Bytes(v)));
                b = rest;
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                if n > b.len() {
                    return Err(ProtobufError::TruncatedFixed);
                }
                b = &b[n..];
            }
            wire => return Err(ProtobufError::WireType { num, wire }),
        }
    }
    Ok(out)
}

fn pb_str(v: &PbValue<'_>) -> Result<String, ProtobufError> {
    match v {
        PbValue::Bytes(b) => Ok(String::from_utf8(b.to_vec())?),
        PbValue::Varint(_) => Err(ProtobufError::NotAString),
    }
}

/// A `map<string, X>` entry: key 1, value 2.
fn pb_entry<'a>(v: &PbValue<'a>) -> Result<(String, &'a [u8]), ProtobufError> {
    let PbValue::Bytes(b) = v else {
        return Err(ProtobufError::NotAMapEntry);
    };
    let (mut key, mut value) = (String::new(), &b[..0]);
    for (n, f) in pb_fields(b)? {
        match (n, f) {
            (1, f) => key = pb_str(&f)?,
            (2, PbValue::Bytes(x)) => value = x,
            _ => {}
        }
    }
    Ok((key, value))
}

/// Decodes a Secret sent as Kubernetes protobuf into its JSON form: the `k8s\0` magic and a
/// runtime.Unknown (typeMeta 1, raw 2) around the Secret (metadata 1, data 2, type 3,
/// stringData 4, immutable 5), whose ObjectMeta gives name 1, generateName 2, namespace 3,
/// uid 5, resourceVersion 6, labels 11, annotations 12, finalizers 14 (k8s.io/api v0.36
/// core/v1/generated.proto, k8s.io/apimachinery v0.36.2 pkg/apis/meta/v1/generated.proto
/// and pkg/runtime/generated.proto).
pub(crate) fn protobuf_secret(body: &[u8]) -> Result<Value, ProtobufError> {
    use base64::Engine as _;
    let unknown = body.strip_prefix(b"k8s\0").ok_or(ProtobufError::NoMagic)?;
    let mut raw = None;
    for (n, f) in pb_fields(unknown)? {
        if let (2, PbValue::Bytes(b)) = (n, f) {
            raw = Some(b);
        }
    }
    let raw = raw.ok_or(ProtobufError::NoRaw)?;
    let mut obj = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {}});
    for (n, f) in pb_fields(raw)? {
        match n {
            1 => {
                let PbValue::Bytes(meta) = f else {
                    return Err(ProtobufError::MetadataNotMessage);
                };
                object_meta(meta, &mut obj["metadata"])?;
            }
            2 => {
                let (k, v) = pb_entry(&f)?;
                obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(v));
            }
            3 => obj["type"] = json!(pb_str(&f)?),
            4 => {
                let (k, v) = pb_entry(&f)?;
                obj["stringData"][k] = json!(String::from_utf8_lossy(v).into_owned());
            }
            5 => {
                if let PbValue::Varint(b) = f {
                    obj["immutable"] = json!(b != 0);
                }
            }
            _ => {}
        }
    }
    Ok(obj)
}

/// Fills `metadata` (a JSON object) from an encoded ObjectMeta, field numbers as listed at
/// [`protobuf_secret`]: the identity strings when not empty, the label and annotation
/// maps, the finalizers in order.
fn object_meta(meta: &[u8], metadata: &mut Value) -> Result<(), ProtobufError> {
    for (mn, mf) in pb_fields(meta)? {
        let key = match mn {
            1 => "name",
            2 => "generateName",
            3 => "namespace",
            5 => "uid",
            6 => "resourceVersion",
            11 | 12 => {
                let (k, v) = pb_entry(&mf)?;
                let map = if mn == 11 { "labels" } else { "annotations" };
                metadata[map][k] = json!(String::from_utf8_lossy(v).into_owned());
                continue;
            }
            14 => {
                let list = metadata
                    .as_object_mut()
                    .expect("metadata is an object")
                    .entry("finalizers")
                    .or_insert_with(|| json!([]));
                if let Some(a) = list.as_array_mut() {
                    a.push(json!(pb_str(&mf)?));
                }
                continue;
            }
            _ => continue,
        };
        let v = pb_str(&mf)?;
        if !v.is_empty() {
            metadata[key] = json!(v);
        }
    }
    Ok(())
}
