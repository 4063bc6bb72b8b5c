//! A published snapshot's manifest: what it is made of, each part by its blake3, signed
//! with the cluster's snapshot key. Everything fetched for a snapshot is checked against
//! it, and it is checked against its signature: a bucket is storage, not a trusted party.

use serde::{Deserialize, Serialize};

use crate::error::{RemoteError, Result};

/// Version of the manifest format.
pub const VERSION: u32 = 1;
/// Memory image files are fetched, and checked, in parts of this size.
pub const PART: u64 = 8 << 20;
/// Largest manifest read.
pub const MAX_MANIFEST: u64 = 16 << 20;
/// Most layers or memory files one manifest may list.
const MAX_ENTRIES: usize = 65_536;

/// A manifest's signature, and who made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub bytes: Vec<u8>,
    /// The signing node's certificate (PEM), for keys that are a node's own (a cluster
    /// with an authority); none for a key the nodes share.
    pub signer: Option<String>,
}

/// Signs and checks manifests: the daemons' shared snapshot key, or each node's own key
/// under the cluster's authority.
pub trait Signer: Send + Sync {
    fn sign(&self, body: &[u8]) -> std::result::Result<Signature, String>;
    /// Ok when `signature` is a signature of `body` by a key this node trusts (checked in
    /// constant time where it is a shared secret); else why not.
    fn verify(&self, body: &[u8], signature: &Signature) -> std::result::Result<(), String>;
}

/// Longest signature read (hex digits).
const MAX_SIGNATURE_HEX: usize = 1024;
/// Longest signer certificate read.
const MAX_SIGNER: usize = 16 << 10;

/// One disk layer of a published snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerEntry {
    pub id: String,
    /// blake3 of its metadata record.
    pub meta: String,
    /// blake3 of its chunk table.
    pub chunks: String,
    /// Bytes of its packed blocks.
    pub packed_bytes: u64,
}

/// One memory image file of a published snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
    /// blake3 of the whole file (its object name).
    pub blake3: String,
    /// blake3 of each [`PART`]-sized part, in order.
    pub parts: Vec<String>,
}

/// A memory image file published as a block-store layer (the pages files: large, and read
/// lazily by a restore, so they come chunk by chunk as any disk does).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryLayer {
    /// The file's name in the image directory (`pages-1.img`).
    pub name: String,
    /// Its size in bytes (a whole number of blocks).
    pub size: u64,
    pub layer: LayerEntry,
}

/// A published snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    pub snapshot_id: String,
    /// The publishing node's name.
    pub publisher: String,
    pub published_at: String,
    /// The daemon's own record of the snapshot (checked by the daemon that pulls it).
    pub record: serde_json::Value,
    /// Disk layers, bottom to top.
    pub layers: Vec<LayerEntry>,
    /// Memory image files fetched whole (none for a filesystem snapshot).
    pub memory: Vec<FileEntry>,
    /// Memory image files served as layers (the pages files).
    #[serde(default)]
    pub memory_layers: Vec<MemoryLayer>,
    /// Chunks a restore of this snapshot read first, as `(layer index, chunk)`, in the
    /// order they were read: fetched ahead of the restore. Layer indices count `layers`,
    /// then `memory_layers`.
    #[serde(default)]
    pub prefetch: Vec<(u32, u64)>,
}

impl Manifest {
    /// Bytes a whole copy of the snapshot takes (every layer's blocks and every file).
    pub fn total_bytes(&self) -> u64 {
        let layers: u64 = self.layers.iter().map(|l| l.packed_bytes).sum();
        let pages: u64 = self
            .memory_layers
            .iter()
            .map(|m| m.layer.packed_bytes)
            .sum();
        layers + pages + self.memory.iter().map(|f| f.size).sum::<u64>()
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| {
            Err(RemoteError::invalid(format!(
                "manifest of {}: {m}",
                self.snapshot_id
            )))
        };
        if self.version != VERSION {
            return bad(format!("unsupported version {}", self.version));
        }
        if !safe_name(&self.snapshot_id) {
            return bad("bad snapshot id".into());
        }
        if self.layers.is_empty()
            || self.layers.len() > MAX_ENTRIES
            || self.memory.len() > MAX_ENTRIES
        {
            return bad("layer or file count out of range".into());
        }
        for l in self
            .layers
            .iter()
            .chain(self.memory_layers.iter().map(|m| &m.layer))
        {
            if !is_hex(&l.id, 32) || !is_hex(&l.meta, 64) || !is_hex(&l.chunks, 64) {
                return bad(format!("bad layer entry {}", l.id));
            }
        }
        for m in &self.memory_layers {
            let names_ok = safe_name(&m.name) && m.name != "parent";
            if !names_ok || m.size == 0 || !m.size.is_multiple_of(4096) {
                return bad(format!("bad memory layer entry {:?}", m.name));
            }
        }
        for f in &self.memory {
            let parts = f.size.div_ceil(PART).max(1) as usize;
            let names_ok = safe_name(&f.name) && f.name != "parent";
            if !names_ok
                || !is_hex(&f.blake3, 64)
                || f.parts.len() != parts
                || !f.parts.iter().all(|p| is_hex(p, 64))
            {
                return bad(format!("bad memory file entry {:?}", f.name));
            }
        }
        if self
            .prefetch
            .iter()
            .any(|(l, _)| *l as usize >= self.layers.len() + self.memory_layers.len())
        {
            return bad("prefetch names a layer it does not list".into());
        }
        Ok(())
    }
}

/// What is stored: the manifest's exact bytes, their signature and its signer.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    body: String,
    signature: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signer: Option<String>,
}

/// The bytes to store for `m`, signed.
pub fn seal(m: &Manifest, signer: &dyn Signer) -> Result<Vec<u8>> {
    let body = serde_json::to_string(m).map_err(|e| RemoteError::invalid(e.to_string()))?;
    let sig = signer
        .sign(body.as_bytes())
        .map_err(|e| RemoteError::invalid(format!("cannot sign the manifest: {e}")))?;
    serde_json::to_vec(&Envelope {
        body,
        signature: hex(&sig.bytes),
        signer: sig.signer,
    })
    .map_err(|e| RemoteError::invalid(e.to_string()))
}

/// The bytes of an even number of hex digits.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The manifest in `bytes`, once its signature and contents are checked.
pub fn open(bytes: &[u8], signer: &dyn Signer) -> Result<Manifest> {
    let e: Envelope = serde_json::from_slice(bytes)
        .map_err(|e| RemoteError::invalid(format!("manifest is not a signed envelope: {e}")))?;
    let sig = (e.signature.len() <= MAX_SIGNATURE_HEX)
        .then(|| unhex(&e.signature))
        .flatten()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| RemoteError::invalid("manifest signature is malformed"))?;
    if e.signer.as_ref().is_some_and(|s| s.len() > MAX_SIGNER) {
        return Err(RemoteError::invalid("manifest signer is too long"));
    }
    let sig = Signature {
        bytes: sig,
        signer: e.signer,
    };
    if let Err(why) = signer.verify(e.body.as_bytes(), &sig) {
        return Err(RemoteError::invalid(format!(
            "manifest signature refused: {why}"
        )));
    }
    let m: Manifest = serde_json::from_str(&e.body)
        .map_err(|e| RemoteError::invalid(format!("manifest: {e}")))?;
    m.check()?;
    Ok(m)
}

/// 1-128 characters of `[A-Za-z0-9._-]`, not starting with a dot.
pub fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// blake3 of `bytes`, as hex.
pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A keyed blake3 stands in for the daemon's HMAC.
    pub struct TestKey(pub [u8; 32]);

    impl Signer for TestKey {
        fn sign(&self, body: &[u8]) -> std::result::Result<Signature, String> {
            Ok(Signature {
                bytes: blake3::keyed_hash(&self.0, body).as_bytes().to_vec(),
                signer: None,
            })
        }
        fn verify(&self, body: &[u8], signature: &Signature) -> std::result::Result<(), String> {
            (self.sign(body)? == *signature)
                .then_some(())
                .ok_or_else(|| "not this key's".into())
        }
    }

    pub fn manifest() -> Manifest {
        Manifest {
            version: VERSION,
            snapshot_id: "snap-1".into(),
            publisher: "node-a".into(),
            published_at: "2026-12-04T00:00:00Z".into(),
            record: serde_json::json!({"any": "thing"}),
            layers: vec![LayerEntry {
                id: "0".repeat(32),
                meta: "a".repeat(64),
                chunks: "b".repeat(64),
                packed_bytes: 4096,
            }],
            memory: vec![FileEntry {
                name: "pages-1.img".into(),
                size: PART + 1,
                blake3: "c".repeat(64),
                parts: vec!["d".repeat(64), "e".repeat(64)],
            }],
            prefetch: vec![(0, 3)],
            memory_layers: vec![MemoryLayer {
                name: "pages-1.img".into(),
                size: 8192,
                layer: LayerEntry {
                    id: "1".repeat(32),
                    meta: "a".repeat(64),
                    chunks: "b".repeat(64),
                    packed_bytes: 8192,
                },
            }],
        }
    }

    #[test]
    fn a_sealed_manifest_opens_with_its_key_only() {
        let m = manifest();
        let bytes = seal(&m, &TestKey([1; 32])).unwrap();
        assert_eq!(open(&bytes, &TestKey([1; 32])).unwrap(), m);
        let e = open(&bytes, &TestKey([2; 32])).unwrap_err().to_string();
        assert!(e.contains("signature refused: not this key's"), "{e}");
        let tampered = String::from_utf8(bytes)
            .unwrap()
            .replace("node-a", "node-b");
        assert!(open(tampered.as_bytes(), &TestKey([1; 32])).is_err());
        assert!(open(b"{}", &TestKey([1; 32])).is_err());
    }

    #[test]
    fn signed_nonsense_is_still_refused() {
        let key = TestKey([1; 32]);
        let mut bad = manifest();
        bad.memory[0].name = "../../etc/shadow".into();
        assert!(open(&seal(&bad, &key).unwrap(), &key).is_err());
        let mut bad = manifest();
        bad.memory[0].parts.pop();
        assert!(open(&seal(&bad, &key).unwrap(), &key).is_err());
        let mut bad = manifest();
        bad.layers[0].id = "x".into();
        assert!(open(&seal(&bad, &key).unwrap(), &key).is_err());
        let mut bad = manifest();
        bad.prefetch = vec![(2, 0)];
        assert!(open(&seal(&bad, &key).unwrap(), &key).is_err());
        // A pages layer's index follows the disk's layers.
        let mut good = manifest();
        good.prefetch = vec![(1, 0)];
        assert!(open(&seal(&good, &key).unwrap(), &key).is_ok());
        let mut bad = manifest();
        bad.memory_layers[0].size = 100;
        assert!(open(&seal(&bad, &key).unwrap(), &key).is_err());
        let mut bad = manifest();
        bad.memory_layers[0].name = "../x".into();
        assert!(open(&seal(&bad, &key).unwrap(), &key).is_err());
    }
}
