//! RabbitMQ quorum queues over AMQP 0-9-1: one confirming channel per connection, persistent
//! messages to the default exchange with the queue's name as routing key (as the Python
//! driver publishes), a reader thread following Basic.Ack's delivery tags.

use crate::wire::{dial, payload, read_exact, spawn_reader, Acks};
use crate::{Args, Publisher};
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

const FRAME_END: u8 = 0xCE;

pub struct Amqp {
    writer: TcpStream,
    acks: Arc<Acks>,
    queues: Vec<String>,
    value: Vec<u8>,
    frame_max: usize,
    sent: u64,
    buffer: Vec<u8>,
}

fn shortstr(out: &mut Vec<u8>, text: &str) {
    out.push(text.len() as u8);
    out.extend_from_slice(text.as_bytes());
}

fn push_frame(out: &mut Vec<u8>, kind: u8, channel: u16, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
}

fn method(class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let mut out = class.to_be_bytes().to_vec();
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(args);
    out
}

/// One frame: (type, channel, payload).
fn read_frame(reader: &mut impl Read) -> Result<(u8, u16, Vec<u8>), String> {
    let head = read_exact(reader, 7)?;
    let size = u32::from_be_bytes(head[3..7].try_into().unwrap()) as usize;
    let mut payload = read_exact(reader, size + 1)?;
    if payload.pop() != Some(FRAME_END) {
        return Err("amqp: bad frame end".into());
    }
    Ok((head[0], u16::from_be_bytes([head[1], head[2]]), payload))
}

/// Reads frames until method (class, id) arrives; returns its arguments.
fn expect(reader: &mut impl Read, class: u16, id: u16) -> Result<Vec<u8>, String> {
    loop {
        let (kind, _, payload) = read_frame(reader)?;
        if kind != 1 {
            continue;
        }
        let got = (
            u16::from_be_bytes([payload[0], payload[1]]),
            u16::from_be_bytes([payload[2], payload[3]]),
        );
        if got == (class, id) {
            return Ok(payload[4..].to_vec());
        }
        if got == (10, 50) || got == (20, 40) {
            return Err(format!("amqp: closed: {}", close_reason(&payload[4..])));
        }
    }
}

fn close_reason(args: &[u8]) -> String {
    let code = u16::from_be_bytes([args[0], args[1]]);
    let len = args[2] as usize;
    format!("{code} {}", String::from_utf8_lossy(&args[3..3 + len]))
}

impl Amqp {
    pub fn connect(args: &Args) -> Result<Amqp, String> {
        let mut writer = dial(&args.host, args.port)?;
        let mut reader =
            BufReader::with_capacity(64 * 1024, writer.try_clone().map_err(|e| e.to_string())?);
        let mut out = b"AMQP\x00\x00\x09\x01".to_vec();
        writer.write_all(&out).map_err(|e| e.to_string())?;
        expect(&mut reader, 10, 10)?; // Connection.Start
        let mut start_ok = 0u32.to_be_bytes().to_vec(); // empty client properties
        shortstr(&mut start_ok, "PLAIN");
        let secret = b"\0guest\0guest";
        start_ok.extend_from_slice(&(secret.len() as u32).to_be_bytes());
        start_ok.extend_from_slice(secret);
        shortstr(&mut start_ok, "en_US");
        out.clear();
        push_frame(&mut out, 1, 0, &method(10, 11, &start_ok));
        writer.write_all(&out).map_err(|e| e.to_string())?;
        let tune = expect(&mut reader, 10, 30)?;
        let frame_max = u32::from_be_bytes(tune[2..6].try_into().unwrap());
        let mut tune_ok = tune[0..2].to_vec();
        tune_ok.extend_from_slice(&frame_max.to_be_bytes());
        tune_ok.extend_from_slice(&0u16.to_be_bytes()); // no heartbeats
        let mut open = Vec::new();
        shortstr(&mut open, "/");
        shortstr(&mut open, "");
        open.push(0);
        out.clear();
        push_frame(&mut out, 1, 0, &method(10, 31, &tune_ok));
        push_frame(&mut out, 1, 0, &method(10, 40, &open));
        writer.write_all(&out).map_err(|e| e.to_string())?;
        expect(&mut reader, 10, 41)?;
        out.clear();
        push_frame(&mut out, 1, 1, &method(20, 10, &[0]));
        writer.write_all(&out).map_err(|e| e.to_string())?;
        expect(&mut reader, 20, 11)?;
        out.clear();
        push_frame(&mut out, 1, 1, &method(85, 10, &[0]));
        writer.write_all(&out).map_err(|e| e.to_string())?;
        expect(&mut reader, 85, 11)?;
        let acks = Acks::new();
        spawn_reader(acks.clone(), move |acks| read_acks(reader, acks));
        Ok(Amqp {
            writer,
            acks,
            queues: (0..args.partitions)
                .map(|p| format!("{}-{p}", args.topic))
                .collect(),
            value: payload(args.message_size),
            frame_max: frame_max as usize,
            sent: 0,
            buffer: Vec::new(),
        })
    }
}

fn read_acks(mut reader: BufReader<TcpStream>, acks: &Acks) -> Result<(), String> {
    loop {
        let (kind, _, payload) = read_frame(&mut reader)?;
        if kind != 1 {
            continue;
        }
        match (
            u16::from_be_bytes([payload[0], payload[1]]),
            u16::from_be_bytes([payload[2], payload[3]]),
        ) {
            // Basic.Ack: RabbitMQ confirms in delivery-tag order, so a tag confirms all before it.
            (60, 80) => acks.at_least(u64::from_be_bytes(payload[4..12].try_into().unwrap())),
            (60, 120) => return Err("amqp: publish nacked".into()),
            (10, 50) | (20, 40) => {
                return Err(format!("amqp: closed: {}", close_reason(&payload[4..])))
            }
            _ => {}
        }
    }
}

impl Publisher for Amqp {
    fn publish(&mut self, partition: usize, count: usize) -> Result<(), String> {
        let mut publish = 0u16.to_be_bytes().to_vec();
        shortstr(&mut publish, "");
        shortstr(&mut publish, &self.queues[partition]);
        publish.push(0);
        let publish = method(60, 40, &publish);
        let mut header = 60u16.to_be_bytes().to_vec();
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&(self.value.len() as u64).to_be_bytes());
        header.extend_from_slice(&0x1000u16.to_be_bytes()); // delivery-mode present
        header.push(2); // persistent
        let chunk = self.frame_max.saturating_sub(8).max(1);
        self.buffer.clear();
        for _ in 0..count {
            push_frame(&mut self.buffer, 1, 1, &publish);
            push_frame(&mut self.buffer, 2, 1, &header);
            for piece in self.value.chunks(chunk) {
                push_frame(&mut self.buffer, 3, 1, piece);
            }
        }
        self.sent += count as u64;
        self.writer
            .write_all(&self.buffer)
            .map_err(|e| e.to_string())?;
        self.acks.wait_for(self.sent)
    }
}
