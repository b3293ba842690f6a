//! RabbitMQ streams over the stream protocol (port 5552): a publisher per connection, Publish
//! frames up to the negotiated frame size, a reader thread counting PublishConfirms. Each
//! message is an AMQP 1.0 data section, as rstream and the Java client send it.

use crate::wire::{dial, payload, read_exact, spawn_reader, Acks};
use crate::{Args, Publisher};
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

const RESPONSE_OK: u16 = 1;

pub struct Stream {
    writer: TcpStream,
    acks: Arc<Acks>,
    frame_max: usize,
    message: Vec<u8>,
    sent: u64,
    buffer: Vec<u8>,
}

fn string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as i16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn frame(key: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&key.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// One frame: (key, the bytes after key and version).
fn read_frame(reader: &mut impl Read) -> Result<(u16, Vec<u8>), String> {
    let size = u32::from_be_bytes(read_exact(reader, 4)?.try_into().unwrap()) as usize;
    let data = read_exact(reader, size)?;
    Ok((u16::from_be_bytes([data[0], data[1]]), data[4..].to_vec()))
}

/// Sends a request with correlation id 1 and checks the response code that follows it.
fn call(
    writer: &mut TcpStream,
    reader: &mut impl Read,
    key: u16,
    fields: &[u8],
) -> Result<Vec<u8>, String> {
    let mut body = 1u32.to_be_bytes().to_vec();
    body.extend_from_slice(fields);
    writer
        .write_all(&frame(key, &body))
        .map_err(|e| e.to_string())?;
    loop {
        let (got, data) = read_frame(reader)?;
        if got == key | 0x8000 {
            let code = u16::from_be_bytes([data[4], data[5]]);
            if code != RESPONSE_OK {
                return Err(format!(
                    "stream protocol: command {key:#06x} answered code {code}"
                ));
            }
            return Ok(data[6..].to_vec());
        }
    }
}

impl Stream {
    pub fn connect(args: &Args) -> Result<Stream, String> {
        let mut writer = dial(&args.host, args.port)?;
        let mut reader =
            BufReader::with_capacity(64 * 1024, writer.try_clone().map_err(|e| e.to_string())?);
        let mut properties = 1i32.to_be_bytes().to_vec();
        string(&mut properties, "product");
        string(&mut properties, "raftline-loadgen");
        call(&mut writer, &mut reader, 0x0011, &properties)?;
        call(&mut writer, &mut reader, 0x0012, &[])?;
        let mut auth = Vec::new();
        string(&mut auth, "PLAIN");
        let secret = b"\0guest\0guest";
        auth.extend_from_slice(&(secret.len() as i32).to_be_bytes());
        auth.extend_from_slice(secret);
        call(&mut writer, &mut reader, 0x0013, &auth)?;
        let (key, tune) = read_frame(&mut reader)?;
        if key != 0x0014 {
            return Err(format!("stream protocol: expected Tune, got {key:#06x}"));
        }
        let frame_max = u32::from_be_bytes(tune[0..4].try_into().unwrap());
        let mut answer = frame_max.to_be_bytes().to_vec();
        answer.extend_from_slice(&0u32.to_be_bytes()); // no heartbeats
        writer
            .write_all(&frame(0x0014, &answer))
            .map_err(|e| e.to_string())?;
        let mut vhost = Vec::new();
        string(&mut vhost, "/");
        call(&mut writer, &mut reader, 0x0015, &vhost)?;
        // Publisher id p publishes to partition p's stream (at most 256 on a connection).
        for p in 0..args.partitions.min(256) {
            let mut declare = vec![p as u8];
            string(&mut declare, "");
            string(&mut declare, &format!("{}-{p}", args.topic));
            call(&mut writer, &mut reader, 0x0001, &declare)?;
        }
        let acks = Acks::new();
        spawn_reader(acks.clone(), move |acks| read_confirms(reader, acks));
        let mut message = vec![0x00, 0x53, 0x75, 0xb0];
        message.extend_from_slice(&(args.message_size as u32).to_be_bytes());
        message.extend_from_slice(&payload(args.message_size));
        Ok(Stream {
            writer,
            acks,
            frame_max: frame_max as usize,
            message,
            sent: 0,
            buffer: Vec::new(),
        })
    }
}

fn read_confirms(mut reader: BufReader<TcpStream>, acks: &Acks) -> Result<(), String> {
    loop {
        let (key, data) = read_frame(&mut reader)?;
        match key {
            0x0003 => acks.add(u32::from_be_bytes(data[1..5].try_into().unwrap()) as u64),
            0x0004 => {
                let code = u16::from_be_bytes([data[13], data[14]]);
                return Err(format!("stream publish error, code {code}"));
            }
            _ => {}
        }
    }
}

impl Publisher for Stream {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String> {
        let per_message = self.message.len() + 12;
        let per_frame = ((self.frame_max.saturating_sub(64)) / per_message).max(1);
        let mut left = count;
        self.buffer.clear();
        while left > 0 {
            let n = left.min(per_frame);
            let mut body = vec![partition as u8];
            body.extend_from_slice(&(n as i32).to_be_bytes());
            for _ in 0..n {
                self.sent += 1;
                body.extend_from_slice(&self.sent.to_be_bytes());
                body.extend_from_slice(&(self.message.len() as i32).to_be_bytes());
                body.extend_from_slice(&self.message);
            }
            self.buffer.extend_from_slice(&frame(0x0002, &body));
            left -= n;
        }
        self.writer
            .write_all(&self.buffer)
            .map_err(|e| e.to_string())?;
        self.acks.wait_for(self.sent)
    }
}
