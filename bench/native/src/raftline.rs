//! Raftline over HTTP/1.1 keep-alive: the request/answer exchange on one connection (the
//! consumer's too), and publishing one request per batch, either one Kafka v2 record batch
//! (Content-Type application/vnd.raftline.batch, as the Python client sends) or a JSON body.

use crate::wire::{crc32c, dial, payload, read_exact, read_line, text_payload};
use crate::{Args, Publisher};
use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{SystemTime, UNIX_EPOCH};

/// One keep-alive connection to one node.
pub struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    host: String,
    line: Vec<u8>,
}

/// One answer: its status, the headers a load generator reads, and the body.
pub struct Answer {
    pub status_line: String,
    pub content_type: String,
    /// `Raftline-Leader`: the node a forwarding node passed the request on to.
    pub leader: Option<u64>,
    /// `Raftline-Next-Offset` of a fetch answer in batch format.
    pub next_offset: Option<i64>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn ok(&self) -> bool {
        matches!(self.status_line.split(' ').nth(1), Some("200" | "202"))
    }

    /// The status line and body, for an error message.
    pub fn describe(&self) -> String {
        format!(
            "{}: {}",
            self.status_line,
            String::from_utf8_lossy(&self.body)
        )
    }
}

impl Conn {
    pub fn open(host: &str, port: u16) -> Result<Conn, String> {
        let stream = dial(host, port)?;
        Ok(Conn {
            reader: BufReader::with_capacity(
                64 * 1024,
                stream.try_clone().map_err(|e| e.to_string())?,
            ),
            writer: stream,
            host: format!("{host}:{port}"),
            line: Vec::new(),
        })
    }

    /// One request; `extra` is further header lines, each ending in CRLF.
    pub fn exchange(
        &mut self,
        method: &str,
        path: &str,
        extra: &str,
        body: &[u8],
    ) -> Result<Answer, String> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{extra}Content-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.writer
            .write_all(head.as_bytes())
            .map_err(|e| e.to_string())?;
        self.writer.write_all(body).map_err(|e| e.to_string())?;
        // Status line, headers, then a body of Content-Length bytes.
        read_line(&mut self.reader, &mut self.line)?;
        let mut answer = Answer {
            status_line: String::from_utf8_lossy(&self.line).to_string(),
            content_type: String::new(),
            leader: None,
            next_offset: None,
            body: Vec::new(),
        };
        let mut length = 0usize;
        loop {
            read_line(&mut self.reader, &mut self.line)?;
            if self.line.is_empty() {
                break;
            }
            let header = String::from_utf8_lossy(&self.line).to_ascii_lowercase();
            let Some((name, value)) = header.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name {
                "content-length" => {
                    length = value.parse().map_err(|_| format!("bad header {header}"))?
                }
                "content-type" => answer.content_type = value.to_string(),
                "raftline-leader" => answer.leader = value.parse().ok(),
                "raftline-next-offset" => answer.next_offset = value.parse().ok(),
                _ => {}
            }
        }
        answer.body = read_exact(&mut self.reader, length)?;
        Ok(answer)
    }
}

pub struct Raftline {
    /// Connections by node HTTP port, opened on first use.
    conns: HashMap<u16, Conn>,
    host: String,
    /// The port each partition's batches go to: its leader where known (`--leaders`, then
    /// the `Raftline-Leader` header of a forwarded answer), else `--port`.
    partition_port: Vec<u16>,
    node_ports: HashMap<u64, u16>,
    topic: String,
    acks: String,
    json: bool,
    message_size: usize,
    /// The body of a full batch, built once (per partition for JSON, which names it inside).
    bodies: Vec<Option<(usize, Vec<u8>)>>,
    /// A stamped batch: its body and where each record's value starts in it.
    stamped: Option<(Vec<u8>, Vec<usize>)>,
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
    record_batch_with_offsets(count, value).0
}

/// The batch and the position of each record's value in it (where a stamp goes).
pub fn record_batch_with_offsets(count: usize, value: &[u8]) -> (Vec<u8>, Vec<usize>) {
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
    let mut offsets = Vec::with_capacity(count);
    for i in 0..count {
        record.clear();
        record.push(0); // attributes
        varint(0, &mut record); // timestamp delta
        varint(i as i64, &mut record); // offset delta
        varint(-1, &mut record); // no key
        varint(value.len() as i64, &mut record);
        let value_at = record.len();
        record.extend_from_slice(value);
        varint(0, &mut record); // no headers
        varint(record.len() as i64, &mut out);
        offsets.push(out.len() + value_at);
        out.extend_from_slice(&record);
    }
    let length = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    seal(&mut out);
    (out, offsets)
}

/// Set the batch's CRC over everything after it.
fn seal(batch: &mut [u8]) {
    let crc = crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn json_body(count: usize, value: &[u8], partition: usize, acks: &str) -> Vec<u8> {
    let value = std::str::from_utf8(value).unwrap();
    let message = format!("{{\"value\": \"{value}\", \"partition\": {partition}}}");
    let messages = vec![message; count].join(", ");
    format!("{{\"acks\": \"{acks}\", \"messages\": [{messages}]}}").into_bytes()
}

impl Raftline {
    pub fn connect(args: &Args, json: bool) -> Result<Raftline, String> {
        let mut conns = HashMap::new();
        conns.insert(args.port, Conn::open(&args.host, args.port)?);
        let mut partition_port = vec![args.port; args.partitions];
        for (partition, port) in args.leaders.iter().enumerate().take(args.partitions) {
            partition_port[partition] = *port;
        }
        Ok(Raftline {
            conns,
            host: args.host.clone(),
            partition_port,
            node_ports: args.node_ports.iter().copied().collect(),
            topic: args.topic.clone(),
            acks: args.acks.clone(),
            json,
            message_size: args.message_size,
            bodies: vec![None; args.partitions],
            stamped: None,
        })
    }

    /// Build the partition's cached body of `count` messages unless it is already there.
    fn prepare_body(&mut self, partition: usize, count: usize) {
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
    }

    /// POST one batch body to the partition's leader; follows a `Raftline-Leader` answer.
    fn send(&mut self, partition: usize, body: &[u8]) -> Result<(), String> {
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
        let port = self.partition_port[partition];
        if !self.conns.contains_key(&port) {
            self.conns.insert(port, Conn::open(&self.host, port)?);
        }
        let conn = self.conns.get_mut(&port).unwrap();
        let extra = format!("Content-Type: {content_type}\r\n");
        let answer = conn.exchange("POST", &path, &extra, body)?;
        if !answer.ok() {
            return Err(answer.describe());
        }
        if let Some(port) = answer.leader.and_then(|id| self.node_ports.get(&id)) {
            self.partition_port[partition] = *port;
        }
        Ok(())
    }
}

impl Publisher for Raftline {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String> {
        let slot = if self.json { partition } else { 0 };
        self.prepare_body(partition, count);
        let body = std::mem::take(&mut self.bodies[slot].as_mut().unwrap().1);
        let sent = self.send(partition, &body);
        self.bodies[slot].as_mut().unwrap().1 = body;
        sent
    }

    fn publish_stamped(&mut self, partition: usize, stamps: &[(u64, u32)]) -> Result<(), String> {
        if self.json {
            return Err("stamped batches are record batches: use --system raftline".into());
        }
        let count: usize = stamps.iter().map(|s| s.1 as usize).sum();
        let stale = !matches!(&self.stamped, Some((_, offsets)) if offsets.len() == count);
        if stale {
            self.stamped = Some(record_batch_with_offsets(
                count,
                &payload(self.message_size),
            ));
        }
        let (mut body, offsets) = self.stamped.take().unwrap();
        let mut at = offsets.iter();
        for (stamp, n) in stamps {
            for offset in at.by_ref().take(*n as usize) {
                body[*offset..*offset + 8].copy_from_slice(&(*stamp as i64).to_le_bytes());
            }
        }
        seal(&mut body);
        let sent = self.send(partition, &body);
        self.stamped = Some((body, offsets));
        sent
    }
}
