//! Where random requests land: uniform, or skewed the way fio skews them
//! (`random_distribution=zipf:THETA`, `pareto:H`, `normal:DEV`).
//!
//! `zoned:60/10:30/20:10/70` is fio's hot-spot skew: 60% of the requests go
//! to the first 10% of the region, 30% to the next 20%, 10% to the rest,
//! uniformly within each zone (`zoned_abs:60/16m:40/48m` gives zone sizes in
//! bytes instead).
//!
//! A skewed distribution draws a *rank* (0 is the hottest) and maps it to a
//! block through a fixed scattering permutation, so the hot blocks lie all
//! over the region rather than at its start (fio hashes ranks the same way).
//! Ranks are drawn as fio draws them: Zipf by rejection-inversion (Hörmann
//! and Derflinger), exact for any `THETA > 0`; Pareto as
//! `(n - 1) * u^(ln H / ln(1 - H))`; normal around the middle with a
//! standard deviation of `DEV` percent of the region.

use crate::error::{Error, Result};

/// A distribution of random block indices.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    /// Every block equally likely (fio's `random`, the default).
    Uniform,
    /// Zipf with exponent `theta`: rank `k` has weight `1 / k^theta`.
    Zipf(f64),
    /// fio's Pareto with parameter `h` in (0, 1) (0.2 is "80/20").
    Pareto(f64),
    /// Normal around the middle, standard deviation `dev` percent of the blocks.
    Normal(f64),
    /// fio's `zoned` / `zoned_abs` hot spots.
    Zoned {
        /// Zones in order from the region's start: (percent of requests, size).
        zones: Vec<(f64, f64)>,
        /// Sizes in bytes (`zoned_abs`) rather than percent of the region (`zoned`).
        absolute: bool,
    },
}

impl Distribution {
    /// Parses fio's `random_distribution` value.
    pub fn parse(text: &str) -> Result<Distribution> {
        let hint = "random, zipf:THETA (e.g. zipf:1.2), pareto:H (0 < H < 1, e.g. pareto:0.2), normal:DEV \
                    (DEV in percent of the region, e.g. normal:10), zoned:ACCESS%/SIZE%:... (e.g. \
                    zoned:60/10:30/20:10/70, each column summing to 100) or zoned_abs:ACCESS%/SIZE:...; a :CENTER \
                    is not supported";
        let bad = || Error::spec("random_distribution", text, hint);
        let (kind, arg) = text.split_once(':').unwrap_or((text, ""));
        if kind == "zoned" || kind == "zoned_abs" {
            let absolute = kind == "zoned_abs";
            let mut zones = Vec::new();
            for zone in arg.split(':') {
                let (access, size) = zone.split_once('/').ok_or_else(bad)?;
                let access: f64 =
                    access.trim().parse().ok().filter(|a: &f64| (0.0..=100.0).contains(a)).ok_or_else(bad)?;
                let size = if absolute {
                    crate::units::parse_size(size.trim()).map_err(|_| bad())? as f64
                } else {
                    size.trim().parse().ok().filter(|s: &f64| *s > 0.0 && *s <= 100.0).ok_or_else(bad)?
                };
                zones.push((access, size));
            }
            let accesses: f64 = zones.iter().map(|z| z.0).sum();
            let sizes: f64 = zones.iter().map(|z| z.1).sum();
            if (accesses - 100.0).abs() > 1e-6 || (!absolute && (sizes - 100.0).abs() > 1e-6) {
                return Err(bad());
            }
            return Ok(Distribution::Zoned { zones, absolute });
        }
        if arg.contains(':') {
            return Err(bad());
        }
        let value = || arg.parse::<f64>().ok().filter(|v| v.is_finite());
        match kind {
            "random" if arg.is_empty() => Ok(Distribution::Uniform),
            "zipf" => value().filter(|t| *t > 0.0).map(Distribution::Zipf).ok_or_else(bad),
            "pareto" => value().filter(|h| *h > 0.0 && *h < 1.0).map(Distribution::Pareto).ok_or_else(bad),
            "normal" => value().filter(|d| *d > 0.0).map(Distribution::Normal).ok_or_else(bad),
            _ => Err(bad()),
        }
    }

    /// fio's spelling.
    pub fn name(&self) -> String {
        match self {
            Distribution::Uniform => "random".into(),
            Distribution::Zipf(t) => format!("zipf:{t}"),
            Distribution::Pareto(h) => format!("pareto:{h}"),
            Distribution::Normal(d) => format!("normal:{d}"),
            Distribution::Zoned { zones, absolute } => {
                let parts: Vec<String> = zones
                    .iter()
                    .map(|(a, s)| {
                        if *absolute {
                            format!("{a}/{}", crate::units::format_size(*s as u64))
                        } else {
                            format!("{a}/{s}")
                        }
                    })
                    .collect();
                format!("{}:{}", if *absolute { "zoned_abs" } else { "zoned" }, parts.join(":"))
            }
        }
    }
}

/// Draws block indices in `[0, blocks)` from a [`Distribution`].
#[derive(Debug, Clone)]
pub struct Sampler {
    blocks: u64,
    kind: Kind,
    /// Scattering permutation `rank -> (rank * mul + add) mod blocks`.
    mul: u64,
    add: u64,
}

#[derive(Debug, Clone)]
enum Kind {
    Uniform,
    Zipf(Zipf),
    Pareto {
        pow: f64,
    },
    Normal {
        dev: f64,
    },
    /// Per zone: cumulative share of requests (0-1), first block, blocks.
    Zoned(Vec<(f64, u64, u64)>),
}

impl Sampler {
    /// A sampler over `blocks` blocks (at least one) of `block_size` bytes.
    pub fn new(distribution: &Distribution, blocks: u64, block_size: u64) -> Sampler {
        debug_assert!(blocks > 0);
        let kind = match *distribution {
            Distribution::Uniform => Kind::Uniform,
            Distribution::Zipf(theta) => Kind::Zipf(Zipf::new(blocks, theta)),
            Distribution::Pareto(h) => Kind::Pareto { pow: h.ln() / (1.0 - h).ln() },
            Distribution::Normal(dev) => Kind::Normal { dev: blocks as f64 * dev / 100.0 },
            Distribution::Zoned { ref zones, absolute } => {
                let (mut cumulative, mut first, mut out) = (0.0, 0u64, Vec::new());
                for &(access, size) in zones {
                    let zone = if absolute {
                        (size as u64 / block_size.max(1)).max(1)
                    } else {
                        (blocks as f64 * size / 100.0) as u64
                    };
                    // Zones past the region's end are cut off; the last one reaches it.
                    let len = zone.clamp(1, blocks.saturating_sub(first).max(1));
                    cumulative += access / 100.0;
                    out.push((cumulative, first.min(blocks - 1), len));
                    first = (first + len).min(blocks);
                }
                if let Some(last) = out.last_mut() {
                    last.0 = 1.0;
                    if !absolute {
                        last.2 = blocks - last.1;
                    }
                }
                Kind::Zoned(out)
            }
        };
        // A multiplier coprime with `blocks` makes the map a permutation.
        let mut mul = 0x9e37_79b9_7f4a_7c15 % blocks.max(2);
        while gcd(mul, blocks) != 1 {
            mul += 1;
        }
        Sampler { blocks, kind, mul: mul % blocks.max(1), add: (blocks / 3) % blocks.max(1) }
    }

    /// The block a rank maps to (rank 0 is the hottest).
    pub fn block_of_rank(&self, rank: u64) -> u64 {
        ((rank as u128 * self.mul as u128 + self.add as u128) % self.blocks as u128) as u64
    }

    /// The next block.
    pub fn next(&self, rng: &mut fastrand::Rng) -> u64 {
        let n = self.blocks;
        let rank = match &self.kind {
            Kind::Uniform => return rng.u64(0..n),
            Kind::Zoned(zones) => {
                let u = rng.f64();
                let &(_, first, len) = zones.iter().find(|z| u < z.0).unwrap_or(zones.last().expect("a zone"));
                return first + rng.u64(0..len.max(1));
            }
            Kind::Zipf(z) => z.sample(rng) - 1,
            Kind::Pareto { pow } => (((n - 1) as f64) * rng.f64().powf(*pow)) as u64,
            Kind::Normal { dev } => loop {
                // Box-Muller; a draw outside the region is drawn again.
                let (u1, u2) = (1.0 - rng.f64(), rng.f64());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let x = n as f64 / 2.0 + z * dev;
                if x >= 0.0 && x < n as f64 {
                    break x as u64;
                }
            },
        };
        self.block_of_rank(rank.min(n - 1))
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Zipf over ranks `1..=n` by rejection-inversion: constant expected time
/// whatever `n`, and exact (no table, no approximation of the harmonic sum).
#[derive(Debug, Clone)]
struct Zipf {
    n: f64,
    theta: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let mut z = Zipf { n: n as f64, theta, h_integral_x1: 0.0, h_integral_n: 0.0, s: 0.0 };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(z.n + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    fn sample(&self, rng: &mut fastrand::Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.s || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    /// `h(x) = 1 / x^theta`.
    fn h(&self, x: f64) -> f64 {
        (-self.theta * x.ln()).exp()
    }

    /// An antiderivative of `h`: `(x^(1-theta) - 1) / (1 - theta)`, `ln x` at theta = 1.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.theta) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.theta)).max(-1.0);
        (log1p_over_x(t) * x).exp()
    }
}

/// `(e^x - 1) / x`, 1 at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.exp_m1() / x } else { 1.0 + x / 2.0 * (1.0 + x / 3.0) }
}

/// `ln(1 + x) / x`, 1 at 0.
fn log1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 { x.ln_1p() / x } else { 1.0 - x * (0.5 - x / 3.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(d: Distribution, blocks: u64, draws: usize) -> Vec<u64> {
        let s = Sampler::new(&d, blocks, 4096);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut c = vec![0u64; blocks as usize];
        for _ in 0..draws {
            c[s.next(&mut rng) as usize] += 1;
        }
        c
    }

    /// Share of draws that landed on the hottest `fraction` of blocks.
    fn hot_share(mut c: Vec<u64>, fraction: f64) -> f64 {
        let total: u64 = c.iter().sum();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let hot = (c.len() as f64 * fraction) as usize;
        c[..hot].iter().sum::<u64>() as f64 / total as f64
    }

    #[test]
    fn zipf_gives_the_hot_tenth_the_share_zipf_predicts() {
        for theta in [0.8, 1.0, 1.2] {
            let n = 10_000u64;
            let harmonic = |m: u64| (1..=m).map(|k| (k as f64).powf(-theta)).sum::<f64>();
            let predicted = harmonic(n / 10) / harmonic(n);
            let got = hot_share(counts(Distribution::Zipf(theta), n, 400_000), 0.1);
            assert!(
                (got - predicted).abs() < 0.01,
                "theta {theta}: hot 10% got {got:.4}, zipf predicts {predicted:.4}"
            );
        }
    }

    #[test]
    fn zipf_ranks_have_exact_weights() {
        // Rank 1 against rank 2 is 2^theta to 1.
        let (n, theta) = (1000u64, 1.2);
        let s = Sampler::new(&Distribution::Zipf(theta), n, 4096);
        let c = counts(Distribution::Zipf(theta), n, 400_000);
        let ratio = c[s.block_of_rank(0) as usize] as f64 / c[s.block_of_rank(1) as usize] as f64;
        assert!((ratio - 2f64.powf(theta)).abs() < 0.08, "{ratio}");
    }

    #[test]
    fn hot_blocks_are_scattered_and_every_block_is_reachable() {
        let s = Sampler::new(&Distribution::Zipf(1.2), 1000, 4096);
        let mut seen = vec![false; 1000];
        for rank in 0..1000 {
            seen[s.block_of_rank(rank) as usize] = true;
        }
        assert!(seen.iter().all(|&b| b), "the rank map is a permutation");
        let hottest: Vec<u64> = (0..10).map(|r| s.block_of_rank(r)).collect();
        assert!(hottest.iter().any(|&b| b > 500), "hot blocks spread over the region: {hottest:?}");
    }

    #[test]
    fn pareto_and_normal_are_skewed_uniform_is_not() {
        let uniform = hot_share(counts(Distribution::Uniform, 1000, 200_000), 0.1);
        assert!(uniform < 0.13, "{uniform}");
        let pareto = hot_share(counts(Distribution::Pareto(0.2), 1000, 200_000), 0.2);
        assert!(pareto > 0.7, "pareto:0.2 puts most draws on a fifth of the blocks: {pareto}");
        // normal:5 over 1000 blocks: +-1 sigma (10% of the blocks) holds ~68%.
        let normal = hot_share(counts(Distribution::Normal(5.0), 1000, 200_000), 0.1);
        assert!((0.62..0.75).contains(&normal), "{normal}");
    }

    #[test]
    fn zones_get_their_share_of_requests() {
        let d = Distribution::parse("zoned:60/10:30/20:10/70").unwrap();
        let c = counts(d, 1000, 200_000);
        let share = |from: usize, to: usize| c[from..to].iter().sum::<u64>() as f64 / 200_000.0;
        assert!((share(0, 100) - 0.6).abs() < 0.01, "{}", share(0, 100));
        assert!((share(100, 300) - 0.3).abs() < 0.01);
        assert!((share(300, 1000) - 0.1).abs() < 0.01);
        let d = Distribution::parse("zoned_abs:80/400k:20/4m").unwrap();
        let c = counts(d, 1000, 100_000);
        assert!((c[..100].iter().sum::<u64>() as f64 / 100_000.0 - 0.8).abs() < 0.01);
        for bad in ["zoned:60/10:30/20", "zoned:50/50:60/50", "zoned:x/10:100/90"] {
            assert!(Distribution::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_block_and_bad_values() {
        let s = Sampler::new(&Distribution::Zipf(1.2), 1, 4096);
        let mut rng = fastrand::Rng::with_seed(1);
        assert!((0..100).all(|_| s.next(&mut rng) == 0));
        assert_eq!(Distribution::parse("zipf:1.2").unwrap(), Distribution::Zipf(1.2));
        assert_eq!(Distribution::parse("random").unwrap(), Distribution::Uniform);
        for bad in ["zipf", "zipf:0", "zipf:x", "pareto:1", "normal:-1", "zipf:1.2:0.5"] {
            let e = Distribution::parse(bad).unwrap_err().to_string();
            assert!(e.contains("zipf:THETA"), "{bad}: {e}");
        }
    }
}
