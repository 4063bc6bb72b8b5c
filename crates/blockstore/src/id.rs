//! Layer ids and disk/ref names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Error, Result};

/// A layer id: 128 random bits written as 32 lowercase hex characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LayerId(String);

impl LayerId {
    /// A fresh random id.
    pub fn random() -> Result<LayerId> {
        let bytes = model::ids::random_bytes::<16>()
            .map_err(|e| Error::io("generate a layer id", std::io::Error::other(e)))?;
        Ok(LayerId::from_bytes(&bytes))
    }

    /// The id whose raw bytes are `bytes`.
    pub fn from_bytes(bytes: &[u8; 16]) -> LayerId {
        LayerId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The 16 raw bytes of the id.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            // The string was validated as 32 hex characters at construction.
            *byte = u8::from_str_radix(&self.0[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
        out
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LayerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LayerId({})", self.0)
    }
}

impl FromStr for LayerId {
    type Err = Error;

    fn from_str(s: &str) -> Result<LayerId> {
        let valid = s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if valid {
            Ok(LayerId(s.to_owned()))
        } else {
            Err(Error::InvalidLayerId(s.chars().take(64).collect()))
        }
    }
}

impl Serialize for LayerId {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for LayerId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<LayerId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Checks a disk or ref name: 1 to 128 of `[A-Za-z0-9._-]`, not starting with '.'.
pub fn validate_name(name: &str) -> Result<()> {
    let ok_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    let valid =
        (1..=128).contains(&name.len()) && !name.starts_with('.') && name.bytes().all(ok_char);
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidName(name.chars().take(200).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let id = LayerId::random().unwrap();
        assert_eq!(id.as_str().len(), 32);
        assert_eq!(LayerId::from_bytes(&id.to_bytes()), id);
        assert_eq!(id.to_string().parse::<LayerId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<LayerId>(&json).unwrap(), id);
    }

    #[test]
    fn bad_ids_are_refused() {
        for bad in ["", "abc", &"A".repeat(32), &"g".repeat(32), &"0".repeat(33)] {
            assert!(bad.parse::<LayerId>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<LayerId>("\"xyz\"").is_err());
    }

    #[test]
    fn names_are_validated() {
        for good in ["a", "disk-1", "snap_2.v3", &"x".repeat(128)] {
            validate_name(good).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "..", "a b", &"x".repeat(129), "é"] {
            assert!(
                matches!(validate_name(bad), Err(Error::InvalidName(_))),
                "{bad}"
            );
        }
    }
}
