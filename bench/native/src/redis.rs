//! Redis Streams: one pipeline of XADDs per batch (then WAIT replicas-1 with replicas), as the
//! Python driver sends; a reader thread counts the replies.

use crate::wire::{dial, payload, read_exact, read_line, spawn_reader, Acks};
use crate::{Args, Publisher};
use std::io::{BufReader, Write};
use std::net::TcpStream;

pub struct Redis {
    writer: TcpStream,
    acks: std::sync::Arc<Acks>,
    keys: Vec<String>,
    value: Vec<u8>,
    wait: Option<usize>,
    maxlen: Option<String>,
    expected: u64,
    buffer: Vec<u8>,
}

fn bulk(out: &mut Vec<u8>, item: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", item.len()).as_bytes());
    out.extend_from_slice(item);
    out.extend_from_slice(b"\r\n");
}

impl Redis {
    pub fn connect(args: &Args) -> Result<Redis, String> {
        let stream = dial(&args.host, args.port)?;
        let reader =
            BufReader::with_capacity(256 * 1024, stream.try_clone().map_err(|e| e.to_string())?);
        let acks = Acks::new();
        let replicas = args.replicas;
        spawn_reader(acks.clone(), move |acks| {
            read_replies(reader, replicas, acks)
        });
        Ok(Redis {
            writer: stream,
            acks,
            keys: (0..args.partitions)
                .map(|p| format!("{}-{p}", args.topic))
                .collect(),
            value: payload(args.message_size),
            wait: (args.replicas > 1 && args.acks == "all").then_some(args.replicas - 1),
            maxlen: (args.maxlen > 0).then(|| args.maxlen.to_string()),
            expected: 0,
            buffer: Vec::new(),
        })
    }
}

fn read_replies(
    mut reader: BufReader<TcpStream>,
    replicas: usize,
    acks: &Acks,
) -> Result<(), String> {
    let mut line = Vec::new();
    loop {
        read_line(&mut reader, &mut line)?;
        match line.first() {
            Some(b'$') => {
                let size: i64 = String::from_utf8_lossy(&line[1..])
                    .parse()
                    .map_err(|_| "bad bulk length")?;
                if size >= 0 {
                    read_exact(&mut reader, size as usize + 2)?;
                }
            }
            Some(b':') => {
                // WAIT's answer: how many replicas have the writes.
                let reached: usize = String::from_utf8_lossy(&line[1..]).parse().unwrap_or(0);
                if reached + 1 < replicas {
                    return Err(format!(
                        "WAIT reached {reached} of {} replicas",
                        replicas - 1
                    ));
                }
            }
            Some(b'+') => {}
            _ => return Err(format!("redis: {}", String::from_utf8_lossy(&line))),
        }
        acks.add(1);
    }
}

impl Publisher for Redis {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String> {
        self.buffer.clear();
        for _ in 0..count {
            let trim = self.maxlen.is_some();
            self.buffer
                .extend_from_slice(if trim { b"*8\r\n" } else { b"*5\r\n" });
            bulk(&mut self.buffer, b"XADD");
            bulk(&mut self.buffer, self.keys[partition].as_bytes());
            if let Some(maxlen) = &self.maxlen {
                // Retention for sustained runs: Redis keeps streams in memory.
                bulk(&mut self.buffer, b"MAXLEN");
                bulk(&mut self.buffer, b"~");
                bulk(&mut self.buffer, maxlen.as_bytes());
            }
            bulk(&mut self.buffer, b"*");
            bulk(&mut self.buffer, b"v");
            bulk(&mut self.buffer, &self.value);
        }
        self.expected += count as u64;
        if let Some(replicas) = self.wait {
            self.buffer.extend_from_slice(b"*3\r\n");
            bulk(&mut self.buffer, b"WAIT");
            bulk(&mut self.buffer, replicas.to_string().as_bytes());
            bulk(&mut self.buffer, b"10000");
            self.expected += 1;
        }
        self.writer
            .write_all(&self.buffer)
            .map_err(|e| e.to_string())?;
        self.acks.wait_for(self.expected)
    }
}
