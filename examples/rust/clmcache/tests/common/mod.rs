//! Helpers shared by the CLM and kernel tests: a deterministic generator and
//! a minimal safetensors writer (F32 tensors only).
#![allow(dead_code)]

use std::path::PathBuf;

/// xorshift64*: deterministic, no dependencies.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-scale, scale).
    pub fn uniform(&mut self, scale: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        (2.0 * unit - 1.0) * scale
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(scale)).collect()
    }
}

/// A fresh path in the system's temp directory.
pub fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("clmcache-rust-{}-{}.safetensors", std::process::id(), name))
}

/// Writes F32 tensors `(name, shape, data)` as a .safetensors file: an 8-byte
/// little-endian header length, the JSON header, then the data in the order
/// given.
pub fn write_safetensors(path: &std::path::Path, tensors: &[(&str, &[usize], &[f32])]) {
    let mut header = String::from("{");
    let mut offset = 0usize;
    for (i, (name, shape, data)) in tensors.iter().enumerate() {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{}", name);
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{}\":{{\"dtype\":\"F32\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            name,
            dims.join(","),
            offset,
            offset + 4 * data.len()
        ));
        offset += 4 * data.len();
    }
    header.push('}');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for (_, _, data) in tensors {
        for v in data.iter() {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(path, bytes).expect("write safetensors");
}

pub fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * (1.0 + want.abs())
}
