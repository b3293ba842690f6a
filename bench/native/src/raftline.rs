//! Raftline over HTTP/1.1 keep-alive: one request per batch, either one Kafka v2 record batch
//! (Content-Type application/vnd.raftline.batch, as the Python client sends) or a JSON body.

use crate::wire::{crc32c, dial, payload, read_exact, read_line, text_payload};
use crate::{Args, Publisher};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{SystemTime, UNIX_EPOCH};

pub struct Raftline {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    host: String,
    topic: String,
    acks: String,
    json: bool,
    message_size: usize,
    /// The body of a full batch, built once (per partition for JSON, which names it inside).
    bodies: Vec<Option<(usize, Vec<u8>)>>,
    line: Vec<u8>,
}

fn varint(value: i64, out: &mut Vec<u8>) {
    let mut u = ((value << 1) ^ (value >> 63)) as u64;
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

/// A Kafka v2 record batch of `count` records with `value` and no key, producer id -1.
pub fn record_batch(count: usize, value: &[u8]) -> Vec<u8> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let mut out = Vec::with_capacity(61 + count * (value.len() + 12));
    out.extend_from_slice(&0i64.to_be_bytes()); // base offset: the broker assigns it
    out.extend_from_slice(&0i32.to_be_bytes()); // batch length, set below
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    out.push(2); // magic
    out.extend_from_slice(&0u32.to_be_bytes()); // CRC, set below
    out.extend_from_slice(&0i16.to_be_bytes()); // attributes: no compression, create time
    out.extend_from_slice(&(count as i32 - 1).to_be_bytes());
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    out.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    out.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    out.extend_from_slice(&(count as i32).to_be_bytes());
    let mut record = Vec::with_capacity(value.len() + 16);
    for i in 0..count {
        record.clear();
        record.push(0); // attributes
        varint(0, &mut record); // timestamp delta
        varint(i as i64, &mut record); // offset delta
        varint(-1, &mut record); // no key
        varint(value.len() as i64, &mut record);
        record.extend_from_slice(value);
        varint(0, &mut record); // no headers
        varint(record.len() as i64, &mut out);
        out.extend_from_slice(&record);
    }
    let length = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out
}

fn json_body(count: usize, value: &[u8], partition: usize, acks: &str) -> Vec<u8> {
    let value = std::str::from_utf8(value).unwrap();
    let message = format!("{{\"value\": \"{value}\", \"partition\": {partition}}}");
    let messages = vec![message; count].join(", ");
    format!("{{\"acks\": \"{acks}\", \"messages\": [{messages}]}}").into_bytes()
}

impl Raftline {
    pub fn connect(args: &Args, json: bool) -> Result<Raftline, String> {
        let stream = dial(&args.host, args.port)?;
        Ok(Raftline {
            reader: BufReader::with_capacity(
                64 * 1024,
                stream.try_clone().map_err(|e| e.to_string())?,
            ),
            writer: stream,
            host: format!("{}:{}", args.host, args.port),
            topic: args.topic.clone(),
            acks: args.acks.clone(),
            json,
            message_size: args.message_size,
            bodies: vec![None; args.partitions],
            line: Vec::new(),
        })
    }

    fn body(&mut self, partition: usize, count: usize) -> &[u8] {
        let slot = if self.json { partition } else { 0 };
        let stale = !matches!(&self.bodies[slot], Some((n, _)) if *n == count);
        if stale {
            let body = if self.json {
                json_body(
                    count,
                    &text_payload(self.message_size),
                    partition,
                    &self.acks,
                )
            } else {
                record_batch(count, &payload(self.message_size))
            };
            self.bodies[slot] = Some((count, body));
        }
        &self.bodies[slot].as_ref().unwrap().1
    }
}

impl Publisher for Raftline {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String> {
        let (path, content_type) = if self.json {
            (
                format!("/v1/topics/{}/messages", self.topic),
                "application/json",
            )
        } else {
            let query = format!("partition={partition}&acks={}", self.acks);
            (
                format!("/v1/topics/{}/messages?{query}", self.topic),
                "application/vnd.raftline.batch",
            )
        };
        let host = self.host.clone();
        let body_len = self.body(partition, count).len();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n\
             Content-Length: {body_len}\r\n\r\n"
        );
        self.writer
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string())?;
        let slot = if self.json { partition } else { 0 };
        let body = &self.bodies[slot].as_ref().unwrap().1;
        self.writer.write_all(body).map_err(|e| e.to_string())?;
        // Status line, headers, then a body of Content-Length bytes.
        read_line(&mut self.reader, &mut self.line)?;
        let status_line = String::from_utf8_lossy(&self.line).to_string();
        let status = status_line.split(' ').nth(1).unwrap_or("").to_string();
        let mut length = 0usize;
        loop {
            read_line(&mut self.reader, &mut self.line)?;
            if self.line.is_empty() {
                break;
            }
            let header = String::from_utf8_lossy(&self.line).to_ascii_lowercase();
            if let Some(value) = header.strip_prefix("content-length:") {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad header {header}"))?;
            }
        }
        let answer = read_exact(&mut self.reader, length)?;
        if status != "200" && status != "202" {
            return Err(format!(
                "{status_line}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        Ok(())
    }
}
