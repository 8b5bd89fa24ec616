//! drain-gate's own records as JSON: written with `derive(Serialize)`, read
//! back from a parsed `serde_json::Value` by [`FromJson`].
//!
//! Why not `derive(Deserialize)`: every derived type brings its own copy of
//! serde_json's parser loop, field visitor and `Option`/`Vec` visitors, and
//! serde's float-formatting error path (`invalid type: floating point …`)
//! with them — about a third of the module. Here the parser is instantiated
//! once (for `Value`), and a record is read by a handful of small functions.
//!
//! One source per field name: [`record!`] declares a struct once and derives
//! both directions from that declaration (`field: Type = default` for a field
//! an older record may lack); [`named!`] does the same for an enum serialized
//! as a string.

use serde_json::{Map, Value};
use std::fmt;

/// A record that is not what drain-gate writes: the innermost field that is
/// not, and what it expected there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub expected: &'static str,
}

impl FieldError {
    pub fn expected(expected: &'static str) -> FieldError {
        FieldError {
            field: "",
            expected,
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.field {
            "" => write!(f, "expected {}", self.expected),
            field => write!(f, "{field}: expected {}", self.expected),
        }
    }
}

/// A value read back from the JSON drain-gate wrote.
pub trait FromJson: Sized {
    fn from_json(v: &Value) -> Result<Self, FieldError>;

    /// What a record missing this field reads as (an error, unless the field
    /// may be absent).
    fn missing() -> Result<Self, FieldError> {
        Err(FieldError::expected("a value (the field is missing)"))
    }
}

/// Why bytes are not a record drain-gate wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreadable {
    NotJson,
    FieldError(FieldError),
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::NotJson => f.write_str("not JSON"),
            Unreadable::FieldError(bad) => bad.fmt(f),
        }
    }
}

/// Parses bytes drain-gate wrote into a `T`.
pub fn from_slice<T: FromJson>(bytes: &[u8]) -> Result<T, Unreadable> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| Unreadable::NotJson)?;
    T::from_json(&v).map_err(Unreadable::FieldError)
}

/// Field `name` of `o`; `default` when it is absent or null. `None` when it
/// is not what drain-gate writes, and `bad` says why: a record's fields are
/// read one after another until one is not (see [`record!`]), so that each
/// field costs the module a test rather than an error to copy.
pub fn field<T: FromJson>(
    o: &Map<String, Value>,
    name: &'static str,
    default: Option<fn() -> T>,
    bad: &mut Option<FieldError>,
) -> Option<T> {
    let read = match (o.get(name), default) {
        (None | Some(Value::Null), Some(d)) => Ok(d()),
        (None, None) => T::missing(),
        (Some(v), _) => T::from_json(v),
    };
    let named = |e: FieldError| match e.field {
        "" => FieldError { field: name, ..e },
        _ => e,
    };
    read.map_err(|e| *bad = Some(named(e))).ok()
}

/// `FromJson` for a value `serde_json` reads directly.
macro_rules! read_with {
    ($($t:ty: $read:expr;)*) => {$(
        impl FromJson for $t {
            fn from_json(v: &Value) -> Result<Self, FieldError> {
                $read(v)
            }
        }
    )*};
}

read_with! {
    u64: |v: &Value| v.as_u64().ok_or(FieldError::expected("an unsigned integer"));
    i64: |v: &Value| v.as_i64().ok_or(FieldError::expected("an integer"));
    bool: |v: &Value| v.as_bool().ok_or(FieldError::expected("true or false"));
    String: |v: &Value| v.as_str().map(str::to_string).ok_or(FieldError::expected("a string"));
    u32: |v| narrowed(v, "an integer below 2^32");
    u16: |v| narrowed(v, "an integer below 65536");
}

/// An unsigned integer that must fit `T`; `expected` names the bound.
fn narrowed<T: TryFrom<u64>>(v: &Value, expected: &'static str) -> Result<T, FieldError> {
    u64::from_json(v)?
        .try_into()
        .map_err(|_| FieldError::expected(expected))
}

impl<T: FromJson> FromJson for Option<T> {
    fn from_json(v: &Value) -> Result<Self, FieldError> {
        match v {
            Value::Null => Ok(None),
            v => T::from_json(v).map(Some),
        }
    }

    fn missing() -> Result<Self, FieldError> {
        Ok(None)
    }
}

impl<T: FromJson> FromJson for Vec<T> {
    fn from_json(v: &Value) -> Result<Self, FieldError> {
        let items = v.as_array().ok_or(FieldError::expected("a list"))?;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(T::from_json(item)?);
        }
        Ok(out)
    }
}

/// A struct written with `derive(Serialize)` and read by [`FromJson`], its
/// field names declared once. `field: Type = default` reads `default` when
/// the field is absent or null (a record written before the field existed).
macro_rules! record {
    (
        $(#[$m:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$fm:meta])* $fvis:vis $f:ident : $t:ty $(= $d:expr)? ),* $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(serde::Serialize)]
        $vis struct $name {
            $( $(#[$fm])* $fvis $f: $t, )*
        }

        impl $crate::json::FromJson for $name {
            fn from_json(v: &serde_json::Value) -> Result<Self, $crate::json::FieldError> {
                let o = v.as_object().ok_or($crate::json::FieldError::expected("an object"))?;
                let mut bad = None;
                let read = (|| {
                    Some($name {
                        $( $f: $crate::json::field(o, stringify!($f), $crate::json::record!(@default $t $(, $d)?), &mut bad)?, )*
                    })
                })();
                read.ok_or(bad.unwrap_or($crate::json::FieldError::expected("an object")))
            }
        }
    };
    (@default $t:ty) => { None };
    (@default $t:ty, $d:expr) => { Some((|| $d) as fn() -> $t) };
}

/// An enum serialized as one string per variant, the strings declared once:
/// `name()` returns it, `ALL` lists the variants, and both serde directions
/// use them.
macro_rules! named {
    (
        $(#[$m:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vm:meta])* $v:ident = $s:literal ),* $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(serde::Serialize)]
        $vis enum $name {
            $( $(#[$vm])* #[serde(rename = $s)] $v, )*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[ $( $name::$v, )* ];

            /// The string this variant is written as (status, logs, records).
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$v => $s, )*
                }
            }

            /// The variant written as `s`, if any.
            pub fn from_name(s: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|t| t.name() == s)
            }
        }

        impl $crate::json::FromJson for $name {
            fn from_json(v: &serde_json::Value) -> Result<Self, $crate::json::FieldError> {
                let s = v.as_str().ok_or($crate::json::FieldError::expected("a name"))?;
                $name::from_name(s)
                    .ok_or($crate::json::FieldError::expected("one of the names drain-gate writes"))
            }
        }
    };
}

/// A JSON object written with `derive(Serialize)`, its fields named once:
/// `object!(Name { field: value, … })` declares a struct whose fields each
/// take the type of their value, and builds it. The fields are written in
/// the order given.
macro_rules! object {
    ($name:ident { $( $(#[$m:meta])* $f:ident: $e:expr ),* $(,)? }) => {{
        #[allow(non_camel_case_types)]
        let object = {
            #[derive(serde::Serialize)]
            struct $name<$($f),*> {
                $( $(#[$m])* $f: $f, )*
            }
            $name { $( $f: $e, )* }
        };
        object
    }};
}

/// Whether an optional field is absent: `#[serde(skip_serializing_if =
/// "crate::json::Absent::absent", bound = "field: serde::Serialize +
/// crate::json::Absent")]` leaves it out of an [`object!`].
pub trait Absent {
    fn absent(&self) -> bool;
}

impl<T> Absent for Option<T> {
    fn absent(&self) -> bool {
        self.is_none()
    }
}

pub(crate) use named;
pub(crate) use object;
pub(crate) use record;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    record! {
        #[derive(Clone, Debug, PartialEq, Eq)]
        struct Inner {
            n: u32,
        }
    }

    named! {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Colour {
            Red = "red",
            DarkBlue = "dark_blue",
        }
    }

    record! {
        #[derive(Clone, Debug, PartialEq, Eq)]
        struct Outer {
            a: u64,
            b: Option<u64>,
            c: bool = false,
            colour: Colour,
            inner: Vec<Inner>,
            late: u64 = 7,
        }
    }

    fn outer() -> Outer {
        Outer {
            a: 1,
            b: Some(2),
            c: true,
            colour: Colour::DarkBlue,
            inner: vec![Inner { n: 3 }],
            late: 9,
        }
    }

    #[test]
    fn a_record_reads_back_what_it_wrote() {
        let bytes = serde_json::to_vec(&outer()).unwrap();
        assert_eq!(from_slice::<Outer>(&bytes), Ok(outer()));
    }

    #[test]
    fn absent_fields_take_their_defaults_and_options_are_none() {
        let v = json!({"a": 1, "colour": "red", "inner": []});
        let o = Outer::from_json(&v).unwrap();
        assert_eq!((o.b, o.c, o.late), (None, false, 7));
    }

    #[test]
    fn a_wrong_field_is_named_with_its_path() {
        let v = json!({"a": 1, "colour": "red", "inner": [{"n": "x"}]});
        let e = Outer::from_json(&v).unwrap_err();
        assert_eq!(e.to_string(), "n: expected an unsigned integer");
        let v = json!({"colour": "red", "inner": []});
        assert_eq!(
            Outer::from_json(&v).unwrap_err().to_string(),
            "a: expected a value (the field is missing)"
        );
        let v = json!({"a": 1, "colour": "green", "inner": []});
        assert_eq!(Outer::from_json(&v).unwrap_err().field, "colour");
        assert_eq!(from_slice::<Outer>(b"{"), Err(Unreadable::NotJson));
        assert_eq!(
            u32::from_json(&json!(1u64 << 40)).unwrap_err().expected,
            "an integer below 2^32"
        );
    }

    #[test]
    fn a_named_enum_writes_and_reads_its_names() {
        for c in Colour::ALL {
            let v = serde_json::to_value(c).unwrap();
            assert_eq!(v, json!(c.name()));
            assert_eq!(Colour::from_json(&v), Ok(*c));
        }
    }
}
