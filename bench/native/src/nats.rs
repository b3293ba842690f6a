//! NATS JetStream: pipelined PUBs with a reply inbox per connection; a reader thread counts the
//! PubAcks (a JetStream error answer fails the run) and answers the server's PINGs.

use crate::wire::{dial, payload, read_exact, read_line, spawn_reader, Acks};
use crate::{Args, Publisher};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

pub struct Nats {
    writer: Arc<Mutex<TcpStream>>,
    acks: Arc<Acks>,
    subjects: Vec<String>,
    inbox: String,
    value: Vec<u8>,
    sent: u64,
    buffer: Vec<u8>,
}

impl Nats {
    pub fn connect(args: &Args, worker: usize) -> Result<Nats, String> {
        let stream = dial(&args.host, args.port)?;
        let mut reader =
            BufReader::with_capacity(256 * 1024, stream.try_clone().map_err(|e| e.to_string())?);
        let mut line = Vec::new();
        read_line(&mut reader, &mut line)?; // INFO {...}
        if !line.starts_with(b"INFO") {
            return Err(format!(
                "nats: expected INFO, got {}",
                String::from_utf8_lossy(&line)
            ));
        }
        let inbox = format!("_INBOX.loadgen{}.{}", std::process::id(), worker);
        let hello = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":false,\"protocol\":1,\
             \"name\":\"raftline-loadgen\"}}\r\nSUB {inbox}.* 1\r\nPING\r\n"
        );
        let mut writer = stream;
        writer
            .write_all(hello.as_bytes())
            .map_err(|e| e.to_string())?;
        loop {
            read_line(&mut reader, &mut line)?;
            if line.starts_with(b"PONG") {
                break;
            }
            if line.starts_with(b"-ERR") {
                return Err(format!("nats: {}", String::from_utf8_lossy(&line)));
            }
        }
        let writer = Arc::new(Mutex::new(writer));
        let acks = Acks::new();
        let pong_writer = writer.clone();
        spawn_reader(acks.clone(), move |acks| {
            read_acks(reader, pong_writer, acks)
        });
        Ok(Nats {
            writer,
            acks,
            subjects: (0..args.partitions)
                .map(|p| format!("{}.{p}", args.topic))
                .collect(),
            inbox,
            value: payload(args.message_size),
            sent: 0,
            buffer: Vec::new(),
        })
    }
}

fn read_acks(
    mut reader: BufReader<TcpStream>,
    writer: Arc<Mutex<TcpStream>>,
    acks: &Acks,
) -> Result<(), String> {
    let mut line = Vec::new();
    loop {
        read_line(&mut reader, &mut line)?;
        if line.starts_with(b"MSG ") {
            // MSG <subject> <sid> [reply-to] <#bytes>
            let text = String::from_utf8_lossy(&line).to_string();
            let size: usize = text
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or(format!("bad {text}"))?;
            let body = read_exact(&mut reader, size + 2)?;
            if body.windows(8).any(|w| w == b"\"error\":") {
                return Err(format!(
                    "jetstream: {}",
                    String::from_utf8_lossy(&body[..size])
                ));
            }
            acks.add(1);
        } else if line.starts_with(b"PING") {
            writer
                .lock()
                .unwrap()
                .write_all(b"PONG\r\n")
                .map_err(|e| e.to_string())?;
        } else if line.starts_with(b"-ERR") {
            return Err(format!("nats: {}", String::from_utf8_lossy(&line)));
        }
    }
}

impl Publisher for Nats {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String> {
        self.buffer.clear();
        let subject = &self.subjects[partition];
        for _ in 0..count {
            self.sent += 1;
            let head = format!(
                "PUB {subject} {}.{} {}\r\n",
                self.inbox,
                self.sent,
                self.value.len()
            );
            self.buffer.extend_from_slice(head.as_bytes());
            self.buffer.extend_from_slice(&self.value);
            self.buffer.extend_from_slice(b"\r\n");
        }
        self.writer
            .lock()
            .unwrap()
            .write_all(&self.buffer)
            .map_err(|e| e.to_string())?;
        self.acks.wait_for(self.sent)
    }
}
