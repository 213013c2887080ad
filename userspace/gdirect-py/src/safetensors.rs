// SPDX-License-Identifier: GPL-2.0 OR MIT
//! The safetensors loader's work per tensor, in native code: the header's entries parsed and
//! checked (`header`), each run of tensors laid out in its buffer (`layout`), and the tensors
//! made as views of that buffer (`views`). They are the fast path of what
//! `gdirect/safetensors.py` does in Python, and give way to it: `header` answers `None` for any
//! header that is not plainly valid, and the Python parser then reads it and names what is
//! wrong; `layout` computes what `_layout` computes, the same numbers; `views` makes the views
//! `_Pt.views` would, and hands back the tensors it does not make.

use std::{
    collections::{HashMap, HashSet},
    fmt,
};

use pyo3::{
    intern,
    prelude::*,
    types::{PyDict, PyList, PyString, PyTuple, PyType},
};
use serde::{
    de::{self, DeserializeSeed, MapAccess, Visitor},
    Deserialize, Deserializer,
};

/// One tensor's entry, as the format writes it. Other keys, which safetensors ignores once
/// serde_json has read them (nesting, numbers, UTF-8 and all), are the Python parser's: it
/// checks them as serde_json does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// A JSON object of strings to strings, in its order; a repeated key is an error here (Python's
/// `json` keeps the last value at the first place: the Python parser takes such a header).
struct Metadata(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of strings to strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
                let (mut out, mut seen) = (Vec::new(), HashSet::new());
                while let Some((k, v)) = map.next_entry::<String, String>()? {
                    if !seen.insert(k.clone()) {
                        return Err(de::Error::custom("a repeated key"));
                    }
                    out.push((k, v));
                }
                Ok(Metadata(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The header: its tensors in the file's order and its metadata (`null` or absent: none).
struct Parsed {
    tensors: Vec<(String, Entry)>,
    metadata: Option<Metadata>,
}

struct ParsedSeed;

impl<'de> DeserializeSeed<'de> for ParsedSeed {
    type Value = Parsed;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Parsed;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a safetensors header")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
                let mut tensors = Vec::with_capacity(map.size_hint().unwrap_or(0));
                let (mut seen, mut metadata, mut had_metadata) = (HashSet::new(), None, false);
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        if had_metadata {
                            return Err(de::Error::custom("a repeated key"));
                        }
                        had_metadata = true;
                        metadata = map.next_value::<Option<Metadata>>()?;
                        continue;
                    }
                    if !seen.insert(key.clone()) {
                        return Err(de::Error::custom("a repeated key"));
                    }
                    tensors.push((key, map.next_value::<Entry>()?));
                }
                Ok(Parsed { tensors, metadata })
            }
        }
        d.deserialize_map(V)
    }
}

/// The checks of `_parse_header`, without their messages: the tensors in the data section's
/// order and the metadata, or `None` where one fails.
fn check(
    raw: &[u8],
    data_len: u64,
    bits: &HashMap<String, u64>,
) -> Option<(Vec<(String, Entry)>, Metadata)> {
    let mut de = serde_json::Deserializer::from_slice(raw);
    let mut parsed = ParsedSeed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    for (_, e) in &parsed.tensors {
        let numel = e.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        let tbits = bits.get(&e.dtype)?.checked_mul(numel)?;
        let (start, end) = e.data_offsets;
        if tbits % 8 != 0 || start > end || end - start != tbits / 8 {
            return None;
        }
    }
    // End to end from the data section's first byte, to its last (a stable sort, as Python's).
    parsed.tensors.sort_by_key(|(_, e)| e.data_offsets);
    let mut at = 0;
    for (_, e) in &parsed.tensors {
        if e.data_offsets.0 != at {
            return None;
        }
        at = e.data_offsets.1;
    }
    (at == data_len).then_some((
        parsed.tensors,
        parsed.metadata.unwrap_or(Metadata(Vec::new())),
    ))
}

/// The tensors of a safetensors header (`raw`, the JSON after the length) whose data section is
/// `data_len` bytes, checked as `gdirect.safetensors._parse_header` checks them: `(tensors,
/// metadata)`, the tensors as `info` (the `TensorInfo` named tuple) in the data section's
/// order, the metadata a dict; or `None` for a header that is not plainly valid (an error of
/// any kind, a repeated key, a name that is not valid UTF-8), for the Python parser to read.
/// `dtype_bits`: bits per element of each dtype the package knows.
#[pyfunction]
pub(crate) fn safetensors_header<'py>(
    py: Python<'py>,
    raw: &[u8],
    data_len: u64,
    dtype_bits: HashMap<String, u64>,
    info: &Bound<'py, PyType>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Some((tensors, metadata)) = py.allow_threads(|| check(raw, data_len, &dtype_bits)) else {
        return Ok(None);
    };
    // Named tuples made by tuple.__new__ (no Python code per tensor), the dtype strings shared.
    let new = py.get_type::<PyTuple>().getattr("__new__")?;
    let mut dtypes: HashMap<&str, Bound<'py, PyString>> = HashMap::new();
    let list = PyList::empty(py);
    for (name, t) in &tensors {
        let dtype = dtypes
            .entry(t.dtype.as_str())
            .or_insert_with(|| PyString::new(py, &t.dtype))
            .clone();
        let shape = PyTuple::new(py, &t.shape)?;
        let (start, end) = t.data_offsets;
        let fields = PyTuple::new(
            py,
            [
                PyString::new(py, name).into_any(),
                dtype.into_any(),
                shape.into_any(),
                start.into_pyobject(py)?.into_any(),
                end.into_pyobject(py)?.into_any(),
            ],
        )?;
        list.append(new.call1((info, fields))?)?;
    }
    let meta = PyDict::new(py);
    for (k, v) in metadata.0 {
        meta.set_item(k, v)?;
    }
    Ok(Some(PyTuple::new(py, [list.into_any(), meta.into_any()])?))
}

/// A JSON value read whole and dropped: unlike `serde::de::IgnoredAny`, which skips a value
/// without reading its numbers and escapes, each part is read as a value of its own would be,
/// so that what serde_json refuses there (a number out of its range) is refused.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// Why serde_json refuses `raw` as a JSON value, or `None`: what safetensors' reading of its
/// header refuses before it looks at any field (numbers out of serde_json's range, whose reading
/// is not Python's exact one; escapes, nesting, what follows the value), with nothing kept.
#[pyfunction]
pub(crate) fn safetensors_json_error(py: Python<'_>, raw: &[u8]) -> Option<String> {
    py.allow_threads(|| {
        let mut de = serde_json::Deserializer::from_slice(raw);
        Checked::deserialize(&mut de)
            .and_then(|_| de.end())
            .err()
            .map(|e| e.to_string())
    })
}

/// Where a run's tensors go in its buffer, as `gdirect.safetensors._layout` computes it: each
/// at an offset its dtype's size divides (`dtype_sizes`; 1 for a dtype not in it), the file's
/// bytes kept in one piece while their alignment allows. `tensors`: the run's `TensorInfo`s,
/// in file order. Returns the buffer's size, the reads that fill it (data section offset,
/// buffer offset, length) and each tensor's offset in the buffer.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn safetensors_layout(
    tensors: &Bound<'_, PyList>,
    dtype_sizes: &Bound<'_, PyDict>,
) -> PyResult<(u64, Vec<(u64, u64, u64)>, Vec<u64>)> {
    let (mut segs, mut offsets) = (Vec::new(), Vec::with_capacity(tensors.len()));
    // The buffer offset less the data offset in the current piece, and where the piece began.
    let (mut shift, mut end, mut seg_file, mut seg_buf): (Option<i128>, u64, u64, u64) =
        (None, 0, 0, 0);
    for t in tensors.iter() {
        let size = match dtype_sizes.get_item(t.get_item(1)?)? {
            Some(s) => s.extract::<u64>()?.max(1),
            None => 1,
        };
        let (start, stop): (u64, u64) = (t.get_item(3)?.extract()?, t.get_item(4)?.extract()?);
        let aligned = shift.is_some_and(|s| (i128::from(start) + s) % i128::from(size) == 0);
        if !aligned {
            if shift.is_some() {
                segs.push((seg_file, seg_buf, end - seg_buf));
            }
            seg_buf = end.div_ceil(size) * size;
            seg_file = start;
            shift = Some(i128::from(seg_buf) - i128::from(start));
        }
        let off = u64::try_from(i128::from(start) + shift.unwrap_or(0))
            .map_err(|_| pyo3::exceptions::PyValueError::new_err("a tensor before its run"))?;
        offsets.push(off);
        end = stop
            .checked_sub(start)
            .and_then(|n| off.checked_add(n))
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("a tensor's offsets"))?;
    }
    if shift.is_some() {
        segs.push((seg_file, seg_buf, end - seg_buf));
    }
    Ok((end, segs, offsets))
}

/// The tensors of a run as views of its buffer, as `_Pt.views` makes them: tensor `i`
/// (`tensors[i]`, a `TensorInfo`) at byte `offsets[i]` of the buffer becomes
/// `typed[dtype].as_strided(shape, contiguous strides, offsets[i] / size)`, put in `out` under
/// its name, where `typed[dtype]` is a view of the whole buffer as that dtype and `size` its
/// bytes per element (`sizes[dtype]`). Returns the indices of the tensors it leaves to the
/// caller: those of a dtype not in `typed`, empty ones, and any whose offset the size does not
/// divide (none, from `layout`).
#[pyfunction]
pub(crate) fn safetensors_views(
    py: Python<'_>,
    tensors: &Bound<'_, PyList>,
    offsets: Vec<u64>,
    typed: &Bound<'_, PyDict>,
    sizes: &Bound<'_, PyDict>,
    out: &Bound<'_, PyDict>,
) -> PyResult<Vec<usize>> {
    if offsets.len() != tensors.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "one offset for each tensor",
        ));
    }
    let as_strided = intern!(py, "as_strided");
    let mut left = Vec::new();
    let mut strides: Vec<u64> = Vec::new();
    for (i, (t, &off)) in tensors.iter().zip(&offsets).enumerate() {
        let dtype = t.get_item(1)?;
        let (start, end): (u64, u64) = (t.get_item(3)?.extract()?, t.get_item(4)?.extract()?);
        let (Some(view), Some(size)) = (typed.get_item(&dtype)?, sizes.get_item(&dtype)?) else {
            left.push(i);
            continue;
        };
        let size: u64 = size.extract()?;
        if start == end || size == 0 || off % size != 0 {
            left.push(i);
            continue;
        }
        let shape = t.get_item(2)?;
        let dims: Vec<u64> = shape.extract()?;
        strides.clear();
        let mut acc = 1u64;
        for &d in dims.iter().rev() {
            strides.push(acc);
            acc = acc.saturating_mul(d);
        }
        strides.reverse();
        let v = view.call_method1(as_strided, (shape, PyTuple::new(py, &strides)?, off / size))?;
        out.set_item(t.get_item(0)?, v)?;
    }
    Ok(left)
}
