//! [`ContextBuilder`]: a repository at a commit → ranked, budgeted, ordered, tokenized blocks.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use git2::Repository;
use moka::sync::Cache;

use crate::cap::shown_outline;
use crate::context::{assemble, Block, SegmentKind};
use crate::history::{history, ChangeCache, History};
use crate::manifest;
use crate::order::{block_ages, order_blocks, BlockAges};
use crate::outline::{plain_fence_tag, Lang};
use crate::rank::rank;
use crate::refs::{DefinitionShown, References};
use crate::render::{
    full_block, manifest_block, outline_block, outline_version, text_version, HEADER, HEADER_VERSION, MAX_OUTLINE_BYTES,
};
use crate::rules::FileFilter;
use crate::select::{select, Budget};
use crate::snapshot::{blob_text, candidates, BlobCache, Candidate};
use crate::stability::StabilityModel;
use crate::store::tree::find_commit;
use crate::token_cache::{TokenCache, Tokens};
use crate::{CommitId, ContextError, ContextOptions, Mirror, Order, RepoContext, TokenCounter};

/// Cached tokenizations weigh at most this many tokens in all.
const TOKEN_CACHE_TOKENS: u64 = 16 << 20;
/// Per-commit change lists kept.
const CHANGE_CACHE_COMMITS: u64 = 100_000;
/// Per-(commit, depth) history statistics kept.
const HISTORY_CACHE_ENTRIES: u64 = 1024;

/// Builds repository contexts. `Send + Sync`, cheap to clone (clones share the caches).
///
/// Caches, none of which can go stale: file analyses by blob id (a blob never changes), block
/// tokenizations by (tokenizer, block identity) for tokenizers with a
/// [`TokenCounter::cache_id`], each commit's changed paths, and history statistics by (commit,
/// depth).
#[derive(Clone)]
pub struct ContextBuilder {
    blobs: BlobCache,
    tokens: TokenCache,
    changes: ChangeCache,
    histories: Cache<(CommitId, usize), Arc<History>>,
}

impl fmt::Debug for ContextBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextBuilder").field("analyses", &self.blobs.entry_count()).finish_non_exhaustive()
    }
}

/// The blocks chosen at one commit, before ordering.
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    pub header: Option<Block>,
    pub blocks: Vec<Block>,
    /// Which names the commit's files reference (what outlines show first).
    pub references: Arc<References>,
}

impl ContextBuilder {
    /// A builder whose analysis cache holds up to `outline_cache_entries` blobs.
    pub fn new(outline_cache_entries: u64) -> ContextBuilder {
        let weigh = |_: &_, v: &Arc<[u32]>| u32::try_from(v.len()).unwrap_or(u32::MAX).max(1);
        ContextBuilder {
            blobs: Cache::new(outline_cache_entries),
            tokens: Cache::builder().max_capacity(TOKEN_CACHE_TOKENS).weigher(weigh).build(),
            changes: Cache::new(CHANGE_CACHE_COMMITS),
            histories: Cache::new(HISTORY_CACHE_ENTRIES),
        }
    }

    /// The context of `mirror` at `commit`: the header, then the chosen blocks in `opts.order`,
    /// never more than `opts.budget_tokens` tokens. Deterministic: the same commit and options give
    /// byte-identical text and identical tokens, whatever the caches hold.
    pub fn build(
        &self,
        mirror: &Mirror,
        commit: &CommitId,
        opts: &ContextOptions,
        tok: &dyn TokenCounter,
    ) -> Result<RepoContext, ContextError> {
        let repo = mirror.repo()?;
        let tokens = Tokens::new(tok, &self.tokens);
        let prepared = self.prepare(&repo, commit, opts, &tokens)?;
        let ages = match opts.order {
            Order::Path => None,
            _ => Some(self.block_ages(&repo, commit, opts.history_depth, &prepared)?),
        };
        Ok(arrange(commit, &prepared, opts.order, ages.as_ref(), &StabilityModel::DEFAULT))
    }

    /// Each definition that another file of the repository references, and whether the context
    /// of [`ContextBuilder::build`] with the same arguments shows it (sorted by path and name): all
    /// of a full file's, an outline's when it kept the definition's line. A diagnostic, computed
    /// apart from the build.
    pub fn definitions(
        &self,
        mirror: &Mirror,
        commit: &CommitId,
        opts: &ContextOptions,
        tok: &dyn TokenCounter,
    ) -> Result<Vec<DefinitionShown>, ContextError> {
        let repo = mirror.repo()?;
        let tokens = Tokens::new(tok, &self.tokens);
        let prepared = self.prepare(&repo, commit, opts, &tokens)?;
        let kinds: HashMap<&str, SegmentKind> =
            prepared.blocks.iter().filter_map(|b| Some((b.path.as_deref()?, b.kind))).collect();
        let refs = &prepared.references;
        let mut out = Vec::new();
        for c in candidates(&repo, commit, &FileFilter::new(&opts.rules)?, &self.blobs)? {
            let a = c.analysis();
            let kind = kinds.get(c.path.as_str());
            let shown = (kind == Some(&SegmentKind::Outline))
                .then(|| shown_outline(a, MAX_OUTLINE_BYTES, &|n| refs.elsewhere(a, n)).names);
            for name in refs.used_definitions(a) {
                let visible = match kind {
                    Some(SegmentKind::File) => true,
                    Some(SegmentKind::Outline) => shown.as_ref().is_some_and(|s| s.contains(name)),
                    _ => false,
                };
                out.push(DefinitionShown { path: c.path.clone(), name: name.to_string(), visible });
            }
        }
        Ok(out)
    }

    /// Selects and renders the blocks at `commit` (order-independent).
    pub(crate) fn prepare(
        &self,
        repo: &Repository,
        commit: &CommitId,
        opts: &ContextOptions,
        tokens: &Tokens<'_>,
    ) -> Result<Prepared, ContextError> {
        find_commit(repo, commit)?;
        let filter = FileFilter::new(&opts.rules)?;
        let header_tokens = tokens.get(SegmentKind::Header, "", HEADER_VERSION, || Ok(HEADER.to_string()))?;
        if header_tokens.len() > opts.budget_tokens {
            let references = Arc::new(References::default());
            return Ok(Prepared { header: None, blocks: Vec::new(), references });
        }
        let header = Block {
            kind: SegmentKind::Header,
            path: None,
            blob: None,
            version: HEADER_VERSION.to_string(),
            text: Arc::from(HEADER),
            tokens: header_tokens.clone(),
        };
        let files = candidates(repo, commit, &filter, &self.blobs)?;
        let refs = Arc::new(References::new(files.iter().map(Candidate::analysis)));
        let ranked = ranked(&files);
        let total = opts.budget_tokens - header_tokens.len();
        let share = if opts.full_file_share.is_finite() { opts.full_file_share.clamp(0.0, 1.0) } else { 0.0 };
        let budget = Budget { total, full: ((share * opts.budget_tokens as f64) as usize).min(total) };
        let mut cost = |c: &Candidate, kind| block_tokens(repo, c, kind, &refs, tokens);
        let chosen = select(&ranked, &refs, budget, &mut cost)?;
        let blocks = chosen
            .into_iter()
            .map(|(i, kind)| render(repo, ranked[i], kind, &refs, tokens))
            .collect::<Result<_, _>>()?;
        Ok(Prepared { header: Some(header), blocks, references: refs })
    }

    /// When each prepared block's text changed over the history window ending at `commit`.
    pub(crate) fn block_ages(
        &self,
        repo: &Repository,
        commit: &CommitId,
        depth: usize,
        prepared: &Prepared,
    ) -> Result<BlockAges, ContextError> {
        let history = self.history(repo, commit, depth)?;
        block_ages(repo, &history, &prepared.blocks, &prepared.references, &self.blobs)
    }

    pub(crate) fn token_cache(&self) -> &TokenCache {
        &self.tokens
    }

    /// History statistics at `commit` over `depth` first-parent commits, cached.
    pub(crate) fn history(
        &self,
        repo: &Repository,
        commit: &CommitId,
        depth: usize,
    ) -> Result<Arc<History>, ContextError> {
        let key = (commit.clone(), depth);
        if let Some(h) = self.histories.get(&key) {
            return Ok(h);
        }
        let h = Arc::new(history(repo, commit, depth, &self.changes)?);
        self.histories.insert(key, h.clone());
        Ok(h)
    }
}

/// Places the prepared blocks in `order` after the header.
pub(crate) fn arrange(
    commit: &CommitId,
    prepared: &Prepared,
    order: Order,
    ages: Option<&BlockAges>,
    model: &StabilityModel,
) -> RepoContext {
    let mut blocks = prepared.blocks.clone();
    order_blocks(&mut blocks, order, ages, model);
    let all: Vec<Block> = prepared.header.iter().cloned().chain(blocks).collect();
    assemble(commit, &all)
}

/// Files sorted by (rank desc, path asc).
fn ranked(files: &[Candidate]) -> Vec<&Candidate> {
    let inputs: Vec<(&str, &crate::outline::FileAnalysis)> =
        files.iter().map(|c| (c.path.as_str(), c.analysis())).collect();
    let ranks = rank(&inputs);
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by(|&a, &b| ranks[b].total_cmp(&ranks[a]).then_with(|| files[a].path.cmp(&files[b].path)));
    order.into_iter().map(|i| &files[i]).collect()
}

/// The token count of one block of a file, reading the file only on a tokenization miss (and for
/// manifests, whose block text depends on what they hold); `None`: the block would show nothing.
fn block_tokens(
    repo: &Repository,
    c: &Candidate,
    kind: SegmentKind,
    refs: &References,
    tokens: &Tokens<'_>,
) -> Result<Option<usize>, ContextError> {
    if kind == SegmentKind::Outline || manifest::applies(&c.path) {
        let block = render(repo, c, kind, refs, tokens)?;
        return Ok((!block.text.is_empty()).then_some(block.tokens.len()));
    }
    let render_full = || Ok(full_block(&c.path, fence_tag(&c.path), &blob_text(repo, c.oid)?));
    Ok(Some(tokens.get(kind, &c.path, &c.blob.0, render_full)?.len()))
}

fn fence_tag(path: &str) -> &'static str {
    Lang::from_path(path).map_or_else(|| plain_fence_tag(path), Lang::fence_tag)
}

/// A full block's text and version: a manifest without its metadata and tool settings (versioned
/// by its text; empty when nothing is left), any other file as it is (versioned by its blob).
fn full_text(repo: &Repository, c: &Candidate, tag: &str) -> Result<(String, String), ContextError> {
    let content = blob_text(repo, c.oid)?;
    Ok(match manifest::summarize(&c.path, &content) {
        Some(m) if m.text.trim().is_empty() => (String::new(), text_version("manifest:", "")),
        Some(m) => {
            let text = manifest_block(&c.path, tag, &m.left_out, &m.text);
            let version = text_version("manifest:", &text);
            (text, version)
        }
        None => (full_block(&c.path, tag, &content), c.blob.0.clone()),
    })
}

/// Renders and tokenizes one block of a file. The file's text is read only when the block is not
/// yet tokenized or when it is rendered for output.
fn render(
    repo: &Repository,
    c: &Candidate,
    kind: SegmentKind,
    refs: &References,
    tokens: &Tokens<'_>,
) -> Result<Block, ContextError> {
    let tag = fence_tag(&c.path);
    let (text, version) = match kind {
        SegmentKind::Outline => {
            let a = c.analysis();
            let shown = shown_outline(a, MAX_OUTLINE_BYTES, &|n| refs.elsewhere(a, n));
            let text = outline_block(&c.path, tag, &shown.text);
            let version = outline_version(&text);
            (text, version)
        }
        _ => full_text(repo, c, tag)?,
    };
    let toks = tokens.get(kind, &c.path, &version, || Ok(text.clone()))?;
    Ok(Block {
        kind,
        path: Some(c.path.clone()),
        blob: Some(c.blob.clone()),
        version,
        text: Arc::from(text),
        tokens: toks,
    })
}
