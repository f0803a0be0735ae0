//! Ways to damage a safetensors file, each drawn from the crate's seeded generator: byte flips,
//! truncations, a wrong length prefix, edits of the JSON header that leave offsets and shapes
//! inconsistent, and edits that keep the container valid (shapes, dtypes, names, scalar values,
//! metadata) so that the readers' own checks are reached.

use std::collections::{BTreeMap, HashMap};

use nvfp4::problem::Rng;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};

/// The checkpoint prefix the weight sources use.
pub const PREFIX: &str = "model.layers.0.mlp.down_proj.";

/// Names the readers know, without group suffix or prefix.
const NAMES: [&str; 21] = [
    "a",
    "b",
    "b1",
    "b2",
    "sfa",
    "sfb",
    "sfb1",
    "sfb2",
    "sfa_blocked",
    "sfb_blocked",
    "sfb1_blocked",
    "sfb2_blocked",
    "alpha",
    "a_global_scale",
    "b_global_scale",
    "c",
    "weight",
    "weight_scale",
    "weight_scale_2",
    "weight_packed",
    "weight_global_scale",
];

const SUFFIXES: [&str; 8] = ["", "", "_g0", "_g1", "_g2", "_g3", "_g7", "_g01"];

const DTYPES: [Dtype; 11] = [
    Dtype::U8,
    Dtype::I8,
    Dtype::F16,
    Dtype::BF16,
    Dtype::F32,
    Dtype::F64,
    Dtype::F8_E4M3,
    Dtype::F8_E5M2,
    Dtype::I32,
    Dtype::I64,
    Dtype::BOOL,
];

/// One tensor of a file: dtype, shape, bytes.
type Raw = (Dtype, Vec<usize>, Vec<u8>);

/// Tensors and metadata of a valid file.
struct Parsed {
    tensors: BTreeMap<String, Raw>,
    meta: Option<HashMap<String, String>>,
}

fn parse(bytes: &[u8]) -> Option<Parsed> {
    let st = SafeTensors::deserialize(bytes).ok()?;
    let tensors =
        st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    let (_, meta) = SafeTensors::read_metadata(bytes).ok()?;
    Some(Parsed { tensors, meta: meta.metadata().clone() })
}

fn build(p: &Parsed) -> Vec<u8> {
    let views: Vec<(String, TensorView)> = p
        .tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).expect("bytes sized to the shape")))
        .collect();
    safetensors::serialize(views, p.meta.clone()).expect("serialize")
}

fn pick<'a, T>(rng: &mut Rng, v: &'a [T]) -> &'a T {
    &v[rng.below(v.len() as u32) as usize]
}

/// A name a reader might look for.
fn our_name(rng: &mut Rng) -> String {
    let base = *pick(rng, &NAMES);
    let prefix = if base.starts_with("weight") && rng.below(2) == 0 { PREFIX } else { "" };
    format!("{prefix}{base}{}", pick(rng, &SUFFIXES))
}

/// Bytes of `elements` values of `dtype`, `None` when too many to build in a test.
fn sized(dtype: Dtype, elements: usize) -> Option<usize> {
    let bits = elements.checked_mul(dtype.bitsize())?;
    (bits <= 8 << 20 && bits.is_multiple_of(8)).then_some(bits / 8)
}

/// `data` cut or padded (with random bytes) to `len`.
fn resize(mut data: Vec<u8>, len: usize, rng: &mut Rng) -> Vec<u8> {
    while data.len() < len {
        data.push(rng.below(256) as u8);
    }
    data.truncate(len);
    data
}

/// Damages `bytes` once; returns the result and what was done.
pub fn mutate(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    match rng.below(10) {
        0..=1 => flip(bytes, rng),
        2 => truncate(bytes, rng),
        3 => length_prefix(bytes, rng),
        4..=5 => header_edit(bytes, rng),
        _ => valid_edit(bytes, rng).unwrap_or_else(|| flip(bytes, rng)),
    }
}

fn header_end(bytes: &[u8]) -> usize {
    let n = bytes.get(..8).map_or(0, |p| u64::from_le_bytes(p.try_into().unwrap()));
    usize::try_from(n).unwrap_or(usize::MAX).saturating_add(8).min(bytes.len())
}

/// One to four bytes changed, mostly in the header.
fn flip(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    let mut b = bytes.to_vec();
    let limit = if rng.below(4) == 0 { b.len() } else { header_end(bytes) };
    if limit == 0 {
        return (b, "nothing to change".into());
    }
    let mut what = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(limit as u32) as usize;
        b[i] = match rng.below(5) {
            0 => rng.below(256) as u8,
            1 => b[i] ^ (1 << rng.below(8)),
            2 => b'0' + rng.below(10) as u8,
            3 => *pick(rng, b"{}[],:\"-e9 "),
            _ => b'9',
        };
        what.push(i);
    }
    (b, format!("bytes changed at {what:?}"))
}

fn truncate(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    let cut = match rng.below(3) {
        0 => rng.below(16) as usize,
        1 => rng.below(header_end(bytes) as u32 + 1) as usize,
        _ => rng.below(bytes.len() as u32) as usize,
    };
    (bytes[..cut.min(bytes.len())].to_vec(), format!("truncated to {cut} bytes"))
}

fn length_prefix(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    if bytes.len() < 8 {
        return truncate(bytes, rng);
    }
    let mut b = bytes.to_vec();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap());
    let new = match rng.below(6) {
        0 => n.wrapping_add(1),
        1 => n.wrapping_sub(1),
        2 => b.len() as u64,
        3 => 0,
        4 => u64::MAX - rng.below(16) as u64,
        _ => 100_000_000 + rng.below(2) as u64,
    };
    b[..8].copy_from_slice(&new.to_le_bytes());
    (b, format!("header length {n} -> {new}"))
}

/// A new value for one dimension: off by one, scaled a little or a lot, zero, or huge.
fn new_dim(d: u64, rng: &mut Rng) -> u64 {
    match rng.below(9) {
        0 => d.wrapping_add(1),
        1 => d.saturating_sub(1),
        2 => d * 2,
        3 => d * 16,
        4 => d << 20,
        5 => d << 40,
        6 => 0,
        7 => 1 << 62,
        _ => u64::MAX,
    }
}

/// An edit of the JSON header that keeps the data section as it was: shapes, offsets, dtypes,
/// names and metadata made to disagree with the data.
fn header_edit(bytes: &[u8], rng: &mut Rng) -> (Vec<u8>, String) {
    let end = header_end(bytes);
    let Some(Ok(mut v)) = bytes.get(8..end).map(serde_json::from_slice::<Value>) else { return flip(bytes, rng) };
    let Some(what) = edit_header(&mut v, rng) else { return flip(bytes, rng) };
    let mut header = serde_json::to_vec(&v).unwrap();
    while rng.below(2) == 0 {
        header.push(b' ');
    }
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&header);
    b.extend_from_slice(&bytes[end..]);
    (b, what)
}

/// One edit of a parsed header; `None` when the header is not shaped for it.
fn edit_header(v: &mut Value, rng: &mut Rng) -> Option<String> {
    let map = v.as_object_mut()?;
    let names: Vec<String> = map.keys().filter(|k| *k != "__metadata__").cloned().collect();
    if names.is_empty() {
        return None;
    }
    let name = pick(rng, &names).clone();
    Some(match rng.below(8) {
        0 | 1 => {
            let shape = map.get_mut(&name)?.get_mut("shape")?.as_array_mut()?;
            match (rng.below(4), shape.len()) {
                (0, _) => shape.push(json!(1 + rng.below(3))),
                (1, n) if n > 0 => {
                    shape.pop();
                }
                (_, n) if n > 0 => {
                    let i = rng.below(n as u32) as usize;
                    let d = shape[i].as_u64().unwrap_or(1);
                    shape[i] = json!(new_dim(d, rng));
                }
                _ => shape.push(json!(new_dim(1, rng))),
            }
            format!("shape of `{name}` -> {}", map[&name]["shape"])
        }
        2 | 3 => {
            let offsets = map.get_mut(&name)?.get_mut("data_offsets")?.as_array_mut()?;
            let (s, e) = (offsets.first()?.as_u64()?, offsets.get(1)?.as_u64()?);
            let (s, e) = match rng.below(6) {
                0 => (s, e.wrapping_add(1)),
                1 => (s, e.saturating_sub(1)),
                2 => (s.wrapping_add(1), e),
                3 => (e, s),
                4 => (s, new_dim(e, rng)),
                _ => (new_dim(s, rng), e),
            };
            *offsets = vec![json!(s), json!(e)];
            format!("offsets of `{name}` -> [{s}, {e}]")
        }
        4 => {
            let d = if rng.below(8) == 0 { "F5".to_string() } else { pick(rng, &DTYPES).to_string() };
            *map.get_mut(&name)?.get_mut("dtype")? = json!(d);
            format!("dtype of `{name}` -> {d}")
        }
        5 => {
            let to = our_name(rng);
            let t = map.remove(&name)?;
            map.insert(to.clone(), t);
            format!("`{name}` renamed `{to}` in the header only")
        }
        6 => {
            map.remove(&name);
            format!("`{name}` removed from the header only")
        }
        _ => {
            let kinds = ["gemv", "gemm", "dual-gemm", "grouped-gemm", "conv", ""];
            let meta = match rng.below(3) {
                0 => json!({"nvfp4_problem": pick(rng, &kinds)}),
                1 => json!({"nvfp4_problem": 7}),
                _ => json!(["not", "a", "map"]),
            };
            map.insert("__metadata__".into(), meta.clone());
            format!("metadata -> {meta}")
        }
    })
}

/// An edit that keeps the container valid (each tensor's bytes match its shape and dtype), so
/// the readers' checks of names, shapes, dtypes and values are what refuse it.
fn valid_edit(bytes: &[u8], rng: &mut Rng) -> Option<(Vec<u8>, String)> {
    let mut p = parse(bytes)?;
    let names: Vec<String> = p.tensors.keys().cloned().collect();
    if names.is_empty() {
        return None;
    }
    let name = pick(rng, &names).clone();
    let what = match rng.below(9) {
        0 | 1 => {
            let (dtype, mut shape, data) = p.tensors.remove(&name)?;
            match (rng.below(5), shape.len()) {
                (0, _) => shape.push(1 + rng.below(2) as usize),
                (1, n) if n > 0 => {
                    shape.pop();
                }
                (2, n) if n > 1 => shape.swap(0, n - 1),
                (_, n) if n > 0 => {
                    let i = rng.below(n as u32) as usize;
                    shape[i] = match rng.below(5) {
                        0 => shape[i] + 1,
                        1 => shape[i].saturating_sub(1),
                        2 => shape[i] * 2,
                        3 => shape[i] / 2,
                        _ => 0,
                    };
                }
                _ => shape.push(1),
            }
            let len = sized(dtype, shape.iter().product())?;
            let what = format!("`{name}` reshaped to {shape:?}");
            p.tensors.insert(name, (dtype, shape, resize(data, len, rng)));
            what
        }
        2 => {
            let (_, shape, data) = p.tensors.remove(&name)?;
            let dtype = *pick(rng, &DTYPES);
            let len = sized(dtype, shape.iter().product())?;
            p.tensors.insert(name.clone(), (dtype, shape, resize(data, len, rng)));
            format!("`{name}` retyped {dtype}")
        }
        3 => {
            let to = our_name(rng);
            let t = p.tensors.remove(&name)?;
            p.tensors.insert(to.clone(), t);
            format!("`{name}` renamed `{to}`")
        }
        4 => {
            let to = our_name(rng);
            let t = p.tensors[&name].clone();
            p.tensors.insert(to.clone(), t);
            format!("`{name}` copied as `{to}`")
        }
        5 => {
            p.tensors.remove(&name);
            format!("`{name}` removed")
        }
        6 => {
            // A scalar (alpha, a global scale) set to a value a reader must check.
            let scalars: Vec<String> = p
                .tensors
                .iter()
                .filter(|(_, (d, s, _))| *d == Dtype::F32 && s.len() <= 1)
                .map(|(n, _)| n.clone())
                .collect();
            let target = if scalars.is_empty() { name } else { pick(rng, &scalars).clone() };
            let v = *pick(rng, &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, -1.0, 1e-45, 3e38, 0.5, 1.0]);
            p.tensors.insert(target.clone(), (Dtype::F32, vec![], v.to_le_bytes().to_vec()));
            format!("`{target}` = {v}")
        }
        7 => {
            // NaN, max and zero codes in scale or value bytes: still a valid file.
            let (_, _, data) = p.tensors.get_mut(&name)?;
            let n = data.len();
            for _ in 0..1 + rng.below(4) {
                if n > 0 {
                    let i = rng.below(n as u32) as usize;
                    data[i] = *pick(rng, &[0x7F, 0xFF, 0x7E, 0x00, 0x80]);
                }
            }
            format!("data bytes of `{name}` set to special codes")
        }
        _ => {
            let kinds = ["gemv", "gemm", "dual-gemm", "grouped-gemm", "nothing"];
            match rng.below(3) {
                0 => p.meta = None,
                _ => {
                    p.meta = Some(HashMap::from([("nvfp4_problem".to_string(), pick(rng, &kinds).to_string())]));
                }
            }
            format!("metadata -> {:?}", p.meta)
        }
    };
    Some((build(&p), what))
}
