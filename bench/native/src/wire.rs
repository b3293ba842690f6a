//! Shared protocol plumbing: connections, the acknowledgement counter a reader thread feeds,
//! payload bytes, and CRC-32C for Kafka record batches.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

pub fn dial(host: &str, port: u16) -> Result<TcpStream, String> {
    let stream =
        TcpStream::connect((host, port)).map_err(|e| format!("connect {host}:{port}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Messages acknowledged so far on one connection, fed by its reader thread; the publishing
/// thread waits on it. An error ends the connection's use.
#[derive(Default)]
pub struct Acks {
    state: Mutex<(u64, Option<String>)>,
    changed: Condvar,
}

impl Acks {
    pub fn new() -> Arc<Acks> {
        Arc::new(Acks::default())
    }

    pub fn add(&self, n: u64) {
        let mut s = self.state.lock().unwrap();
        s.0 += n;
        self.changed.notify_all();
    }

    /// For protocols whose acknowledgements carry a cumulative sequence number.
    pub fn at_least(&self, n: u64) {
        let mut s = self.state.lock().unwrap();
        if n > s.0 {
            s.0 = n;
            self.changed.notify_all();
        }
    }

    pub fn fail(&self, error: String) {
        let mut s = self.state.lock().unwrap();
        if s.1.is_none() {
            s.1 = Some(error);
        }
        self.changed.notify_all();
    }

    /// Blocks until `target` messages in all were acknowledged.
    pub fn wait_for(&self, target: u64) -> Result<(), String> {
        let mut s = self.state.lock().unwrap();
        loop {
            if let Some(error) = &s.1 {
                return Err(error.clone());
            }
            if s.0 >= target {
                return Ok(());
            }
            let (next, timeout) = self.changed.wait_timeout(s, IO_TIMEOUT).unwrap();
            if timeout.timed_out() && next.0 < target && next.1.is_none() {
                return Err(format!("no acknowledgement within {IO_TIMEOUT:?}"));
            }
            s = next;
        }
    }
}

/// Runs `read_loop` on its own thread; whatever error ends it fails `acks`.
pub fn spawn_reader<F>(acks: Arc<Acks>, read_loop: F)
where
    F: FnOnce(&Acks) -> Result<(), String> + Send + 'static,
{
    std::thread::spawn(move || {
        if let Err(error) = read_loop(&acks) {
            acks.fail(error);
        }
    });
}

/// `size` bytes of a fixed pseudo-random pattern (not compressible, same in every run).
pub fn payload(size: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `size` printable ASCII bytes, for protocols that carry text (Raftline's JSON body).
pub fn text_payload(size: usize) -> Vec<u8> {
    payload(size).into_iter().map(|b| b'a' + b % 26).collect()
}

pub fn read_line(reader: &mut BufReader<TcpStream>, line: &mut Vec<u8>) -> Result<(), String> {
    line.clear();
    let n = reader.read_until(b'\n', line).map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("connection closed".into());
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(())
}

pub fn read_exact(reader: &mut impl Read, n: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; n];
    reader.read_exact(&mut buf).map_err(|e| e.to_string())?;
    Ok(buf)
}

const CASTAGNOLI: u32 = 0x82F6_3B78;

fn crc32c_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    for (i, entry) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ CASTAGNOLI
            } else {
                c >> 1
            };
        }
        *entry = c;
    }
    table
}

/// CRC-32C (Castagnoli), as Kafka record batches carry it; SSE 4.2 where the CPU has it.
pub fn crc32c(data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the feature was detected just above.
            return unsafe { crc32c_sse42(data) };
        }
    }
    let table = crc32c_table();
    !data.iter().fold(!0u32, |c, b| {
        table[((c ^ *b as u32) & 0xFF) as usize] ^ (c >> 8)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut crc: u64 = !0u32 as u64;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(chunk.try_into().unwrap()));
    }
    let mut crc = crc as u32;
    for b in chunks.remainder() {
        crc = _mm_crc32_u8(crc, *b);
    }
    !crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
    }
}
