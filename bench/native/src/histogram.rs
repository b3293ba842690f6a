//! Latency histogram in bench/histogram.py's bucket scheme (log-linear, 128 sub-buckets per
//! power of two, microseconds), written as JSON that `Histogram(**fields)` there reads back.

const SUB_BUCKET_BITS: u32 = 7;
const SUB_BUCKETS: u64 = 1 << SUB_BUCKET_BITS;

/// The bucket of a value, as bench/histogram.py bucket_index.
pub fn bucket_index(value: u64) -> usize {
    if value < SUB_BUCKETS {
        return value as usize;
    }
    let bit_length = 64 - value.leading_zeros();
    let shift = bit_length - SUB_BUCKET_BITS - 1;
    ((shift as u64 + 1) * SUB_BUCKETS + ((value >> shift) - SUB_BUCKETS)) as usize
}

#[derive(Default, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    pub total: u64,
    min: u64,
    max: u64,
    sum: u64,
}

impl Histogram {
    /// Add `count` observations of `value` microseconds.
    pub fn record(&mut self, value: u64, count: u64) {
        let index = bucket_index(value);
        if index >= self.counts.len() {
            self.counts.resize(index + 1, 0);
        }
        self.counts[index] += count;
        self.min = if self.total == 0 {
            value
        } else {
            self.min.min(value)
        };
        self.max = self.max.max(value);
        self.total += count;
        self.sum += value * count;
    }

    pub fn merge(&mut self, other: &Histogram) {
        if other.total == 0 {
            return;
        }
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.min = if self.total == 0 {
            other.min
        } else {
            self.min.min(other.min)
        };
        self.max = self.max.max(other.max);
        self.total += other.total;
        self.sum += other.sum;
    }

    /// The fields of bench/histogram.py's Histogram dataclass as a JSON object.
    pub fn json(&self) -> String {
        let counts: Vec<String> = self.counts.iter().map(u64::to_string).collect();
        format!(
            "{{\"counts\": [{}], \"total\": {}, \"min\": {}, \"max\": {}, \"sum\": {}}}",
            counts.join(", "),
            self.total,
            self.min,
            self.max,
            self.sum
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_the_python_scheme() {
        // bench/histogram.py bucket_index of each value
        let cases = [
            (0, 0),
            (127, 127),
            (128, 128),
            (255, 255),
            (256, 256),
            (257, 256),
        ];
        for (value, index) in cases {
            assert_eq!(bucket_index(value), index, "value {value}");
        }
        assert_eq!(bucket_index(20_000), 1052);
        assert_eq!(bucket_index(1 << 41), 4480);
    }

    #[test]
    fn merging_adds_counts_and_keeps_the_extremes() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(5, 2);
        b.record(300, 1);
        a.merge(&b);
        assert_eq!((a.total, a.min, a.max, a.sum), (3, 5, 300, 310));
        assert_eq!(a.counts[5], 2);
        assert_eq!(a.counts[bucket_index(300)], 1);
    }
}
