//! A synthetic but history-shaped repository: files with heavy-tailed churn, work that clusters in
//! a slowly rotating set of active files, mostly body-only edits, occasional new files. Rust and
//! Python files that call each other, so ranking has a real graph. Deterministic for a seed.
#![allow(dead_code)]

use cachet_context::testing::TestRepo;
use cachet_context::CommitId;

/// SplitMix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

struct File {
    path: String,
    python: bool,
    churn: f64,
    functions: Vec<(String, usize, usize)>, // (name, params, body constant)
    calls: Vec<String>,
}

impl File {
    fn render(&self) -> String {
        let mut s = String::new();
        if self.python {
            s.push_str("import util\n\n");
            for (name, params, k) in &self.functions {
                let ps: Vec<String> = (0..*params).map(|p| format!("a{p}")).collect();
                s.push_str(&format!("def {name}({}):\n", ps.join(", ")));
                for c in &self.calls {
                    s.push_str(&format!("    {c}()\n"));
                }
                s.push_str(&format!("    return {k}\n\n"));
            }
        } else {
            for (name, params, k) in &self.functions {
                let ps: Vec<String> = (0..*params).map(|p| format!("a{p}: u32")).collect();
                s.push_str(&format!("/// Computes {name}.\npub fn {name}({}) -> u32 {{\n", ps.join(", ")));
                for c in &self.calls {
                    s.push_str(&format!("    let _ = {c}();\n"));
                }
                s.push_str(&format!("    {k}\n}}\n\n"));
            }
        }
        s
    }
}

/// Grows a repository with `files` files and `commits` commits after the initial one; returns the
/// head.
pub fn synthetic_repo(repo: &TestRepo, files: usize, commits: usize, seed: u64) -> CommitId {
    synthetic_repo_with(repo, files, commits, seed, 0.15)
}

/// [`synthetic_repo`] where each commit replaces one of the four active files with probability
/// `rotation` (low: long-lived hot spots; high: scattered work).
pub fn synthetic_repo_with(repo: &TestRepo, files: usize, commits: usize, seed: u64, rotation: f64) -> CommitId {
    let mut rng = Rng::new(seed);
    let mut all: Vec<File> = (0..files).map(|i| new_file(&mut rng, i, files)).collect();
    let initial: Vec<(String, String)> = all.iter().map(|f| (f.path.clone(), f.render())).collect();
    let refs: Vec<(&str, Option<&str>)> = initial.iter().map(|(p, c)| (p.as_str(), Some(c.as_str()))).collect();
    let mut head = repo.commit(&refs, "initial").unwrap();
    let mut active: Vec<usize> = (0..4).map(|_| pick(&mut rng, &all)).collect();
    for n in 0..commits {
        if rng.unit() < rotation {
            let slot = rng.below(active.len());
            active[slot] = pick(&mut rng, &all);
        }
        if rng.unit() < 0.03 {
            let i = all.len();
            all.push(new_file(&mut rng, i, files));
            active[rng.below(4)] = i;
        }
        let touches = 1 + rng.below(3);
        let mut touched: Vec<usize> = Vec::new();
        for _ in 0..touches {
            let i = if rng.unit() < 0.75 { active[rng.below(active.len())] } else { pick(&mut rng, &all) };
            if !touched.contains(&i) {
                touched.push(i);
            }
        }
        for &i in &touched {
            edit(&mut rng, &mut all[i]);
        }
        let rendered: Vec<(String, String)> = touched.iter().map(|&i| (all[i].path.clone(), all[i].render())).collect();
        let refs: Vec<(&str, Option<&str>)> = rendered.iter().map(|(p, c)| (p.as_str(), Some(c.as_str()))).collect();
        head = repo.commit(&refs, &format!("change {n}")).unwrap();
    }
    head
}

fn new_file(rng: &mut Rng, i: usize, n: usize) -> File {
    let python = rng.unit() < 0.3;
    let dir = format!("mod{}", i % 12);
    let path = if python { format!("py/{dir}/file{i}.py") } else { format!("src/{dir}/file{i}.rs") };
    // Pareto(alpha = 1.2) churn: most files cold, a few very hot.
    let churn = (1.0 - rng.unit()).powf(-1.0 / 1.2);
    let functions = (0..1 + rng.below(4)).map(|f| (format!("f{i}_{f}_work"), rng.below(3), rng.below(100))).collect();
    // Calls go preferentially to low-numbered (core) files.
    let calls = (0..rng.below(3))
        .map(|_| {
            let target = ((rng.unit().powi(3)) * n as f64) as usize;
            format!("f{}_0_work", target.min(n - 1))
        })
        .collect();
    File { path, python, churn, functions, calls }
}

fn pick(rng: &mut Rng, all: &[File]) -> usize {
    let total: f64 = all.iter().map(|f| f.churn).sum();
    let mut x = rng.unit() * total;
    for (i, f) in all.iter().enumerate() {
        x -= f.churn;
        if x <= 0.0 {
            return i;
        }
    }
    all.len() - 1
}

/// 70% body-only edits (outline unchanged), otherwise a signature change or a new function.
fn edit(rng: &mut Rng, f: &mut File) {
    let which = rng.below(f.functions.len());
    let r = rng.unit();
    if r < 0.7 {
        f.functions[which].2 = rng.below(1000);
    } else if r < 0.9 {
        f.functions[which].1 = (f.functions[which].1 + 1) % 4;
    } else {
        let n = f.functions.len();
        let base = f.functions[0].0.split('_').next().unwrap_or("f").to_string();
        f.functions.push((format!("{base}_{n}_extra"), rng.below(3), rng.below(100)));
    }
}
