//! What a caller can tune: which files are eligible, the token budget, and the block order.

/// Which files of the repository are eligible for the context.
///
/// Built-in skips: binary files (a NUL byte in the first 8 KiB, or not UTF-8), vendored directories
/// (`vendor/`, `node_modules/`, `third_party/`, `.git/`, …) when `skip_vendored`, generated files
/// (lockfiles, `*.min.js`, `*.map`, files whose first lines say `@generated`, `DO NOT EDIT` or `Code
/// generated`) when `skip_generated`, and files over `max_file_bytes`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FileRules {
    /// Files larger than this are skipped. Default 128 KiB.
    pub max_file_bytes: u64,
    /// Glob patterns (gitignore-like globs on the repository-relative path, `**` allowed) skipped in
    /// addition to the built-in skips. A pattern without `/` matches the file name at any depth.
    pub exclude: Vec<String>,
    /// Glob patterns that re-include a file a built-in vendored/generated/size rule skipped. Binary
    /// files are never re-included, and `exclude` wins over `include`.
    pub include: Vec<String>,
    /// Skip vendored directories. Default true.
    pub skip_vendored: bool,
    /// Skip generated files. Default true.
    pub skip_generated: bool,
}

impl Default for FileRules {
    fn default() -> Self {
        Self {
            max_file_bytes: 128 * 1024,
            exclude: Vec::new(),
            include: Vec::new(),
            skip_vendored: true,
            skip_generated: true,
        }
    }
}

/// The order of the included blocks (the set of blocks does not depend on it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Files least likely to change first, estimated from the repository's history (default).
    #[default]
    Stability,
    /// By path.
    Path,
    /// Least recently changed first.
    LastChange,
}

impl Order {
    /// All orders, in a fixed sequence.
    pub const ALL: [Order; 3] = [Order::Stability, Order::Path, Order::LastChange];

    /// The serde name (`stability`, `path`, `last_change`).
    pub fn name(self) -> &'static str {
        match self {
            Order::Stability => "stability",
            Order::Path => "path",
            Order::LastChange => "last_change",
        }
    }
}

/// Everything that shapes one repository context.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ContextOptions {
    /// The rendered context never has more tokens than this. Default 4096 (the server's and the
    /// CLI's default too): about half a minute of cold prefill on two CPU cores.
    pub budget_tokens: usize,
    /// The part of the budget (0.0–1.0) that full files may use; outlines and plain-text files fill
    /// the rest. Default 0.5.
    pub full_file_share: f64,
    /// Block order. Default [`Order::Stability`].
    pub order: Order,
    /// Which files are eligible.
    pub rules: FileRules,
    /// How many first-parent commits of history the stability estimate looks at. Default 500.
    pub history_depth: usize,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            budget_tokens: 4096,
            full_file_share: 0.5,
            order: Order::Stability,
            rules: FileRules::default(),
            history_depth: 500,
        }
    }
}
