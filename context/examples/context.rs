//! Prints the repository context of a repository at a revision, with a summary of its blocks.
//!
//! ```text
//! cargo run -p cachet-context --example context -- PATH [REV] [BUDGET] [stability|path|last_change]
//! ```
//!
//! With `DEFINITIONS=FILE` in the environment it also writes the definitions other files
//! reference to FILE, one `visible|hidden<TAB>path<TAB>name` line each.

use cachet_context::{ContextBuilder, ContextOptions, Mirror, Order, TokenCounter};

/// Roughly four bytes per token, split so that blocks tokenize independently.
struct Approx;

impl TokenCounter for Approx {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.split_inclusive('\n').flat_map(|line| line.as_bytes().chunks(4).map(|c| c.len() as u32)).collect()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mirror = Mirror::open_path(std::path::Path::new(&args[0])).expect("a git repository");
    let commit = mirror.resolve(args.get(1).map_or("main", String::as_str)).expect("a revision");
    let budget = args.get(2).map_or(8192, |b| b.parse().expect("a token budget"));
    let order = match args.get(3).map(String::as_str) {
        Some("path") => Order::Path,
        Some("last_change") => Order::LastChange,
        _ => Order::Stability,
    };
    let opts = ContextOptions { budget_tokens: budget, order, ..ContextOptions::default() };
    let builder = ContextBuilder::new(10_000);
    let ctx = builder.build(&mirror, &commit, &opts, &Approx).expect("a context");
    if let Ok(file) = std::env::var("DEFINITIONS") {
        let all = builder.definitions(&mirror, &commit, &opts, &Approx).expect("the definitions");
        let lines: String = all
            .iter()
            .map(|d| format!("{}\t{}\t{}\n", if d.visible { "visible" } else { "hidden" }, d.path, d.name))
            .collect();
        std::fs::write(&file, lines).expect("writing the definitions");
        let d = cachet_context::DefinitionsVisible::of(&all);
        eprintln!("definitions visible: {} of {}", d.visible, d.referenced);
    }
    println!("{}", ctx.text);
    for s in &ctx.segments {
        eprintln!("{:>6} {:>6} {:?} {}", s.tokens.start, s.tokens.len(), s.kind, s.path.as_deref().unwrap_or("-"));
    }
}
