//! The usage ledger writer. Every finished request's row goes through one
//! task that first appends it to a local spool file (JSON lines, fsynced),
//! then inserts everything the spool holds into Postgres and empties the
//! spool once that succeeded. While Postgres is unreachable rows pile up in
//! the spool and are retried every second; inserts are idempotent on the
//! request id, so a row is never lost and never counted twice. A row the
//! database refuses for good (say, its tenant was purged) is moved to
//! `<spool>.rejected` with the reason, so it can neither block the others
//! nor vanish.

use cachet_tenants::store::Store;
use cachet_tenants::UsageRecord;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Rows per insert.
const BATCH: usize = 500;

/// Sends rows to the writer task (cheap to clone, never blocks).
#[derive(Clone, Debug)]
pub struct Ledger {
    tx: mpsc::UnboundedSender<Msg>,
}

#[derive(Debug)]
enum Msg {
    /// A row, and the span it was recorded in (the request's: its `ledger row` line is logged
    /// inside it once the row is durable).
    Row(Box<UsageRecord>, tracing::Span),
    /// Flush, then answer how many rows are still waiting in the spool.
    Flush(oneshot::Sender<usize>),
}

impl Ledger {
    /// Starts the writer task on the current tokio runtime.
    pub fn start(store: Store, spool: PathBuf) -> std::io::Result<(Ledger, tokio::task::JoinHandle<()>)> {
        if let Some(dir) = spool.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // The spool holds tenants' usage: only cachet's user reads it (files of earlier versions
        // were created 0644).
        for path in [spool.clone(), spool.with_extension("rejected")] {
            if path.exists() {
                std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, spool, rx));
        Ok((Ledger { tx }, task))
    }

    /// Records a row (asynchronously).
    pub fn record(&self, row: UsageRecord) {
        if self.tx.send(Msg::Row(Box::new(row), tracing::Span::current())).is_err() {
            tracing::error!("the ledger writer has stopped; a usage row was not recorded");
        }
    }

    /// Waits until everything recorded so far was written to Postgres or
    /// spooled; returns the rows still waiting for Postgres.
    pub async fn flush(&self) -> usize {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).is_err() {
            return 0;
        }
        rx.await.unwrap_or(0)
    }
}

async fn run(store: Store, spool: PathBuf, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut pending = spooled_rows(&spool);
    if pending > 0 {
        tracing::info!(pending, "usage rows from an earlier run are waiting in the spool");
        pending = drain(&store, &spool).await;
    }
    loop {
        let msg = if pending > 0 {
            match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    pending = drain(&store, &spool).await;
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(msg) = msg else { break };
        let mut rows = Vec::new();
        let mut spans = Vec::new();
        let mut waiters = Vec::new();
        let mut next = Some(msg);
        while let Some(m) = next.take() {
            match m {
                Msg::Row(r, span) => {
                    rows.push(*r);
                    spans.push(span);
                }
                Msg::Flush(w) => waiters.push(w),
            }
            if rows.len() < BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !rows.is_empty() {
            let spooled = append(&spool, &rows);
            if tracing::enabled!(tracing::Level::DEBUG) {
                let durable = if spooled.is_ok() { "spool" } else { "none" };
                for (row, span) in rows.iter().zip(&spans) {
                    span.in_scope(|| {
                        tracing::debug!(
                            request_id = %row.id,
                            status = %row.status,
                            prompt_tokens = row.prompt_tokens,
                            cached_tokens = row.cached_tokens,
                            output_tokens = row.output_tokens,
                            cost = row.cost,
                            durable,
                            "ledger row"
                        )
                    });
                }
            }
            if let Err(e) = spooled {
                // Without the spool the rows must go straight to Postgres.
                tracing::error!("cannot write the ledger spool {}: {e}", spool.display());
                if let Err(e) = store.insert_usage(&rows).await {
                    tracing::error!(rows = rows.len(), "usage rows lost: no spool and no database: {e}");
                }
            }
            pending = drain(&store, &spool).await;
        } else if pending > 0 {
            pending = drain(&store, &spool).await;
        }
        for w in waiters {
            let _ = w.send(pending);
        }
    }
    drain(&store, &spool).await;
}

/// Options that create a file only its owner can read or write (0600).
fn private() -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.create(true).mode(0o600);
    o
}

fn append(spool: &Path, rows: &[UsageRecord]) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = private().read(true).append(true).open(spool)?;
    let mut buf = Vec::new();
    // A crash mid-write leaves a torn last line: end it, so the next row
    // starts on a line of its own instead of being glued to it.
    if f.metadata()?.len() > 0 {
        let mut last = [0u8; 1];
        f.seek(SeekFrom::End(-1))?;
        f.read_exact(&mut last)?;
        if last[0] != b'\n' {
            buf.push(b'\n');
        }
    }
    for r in rows {
        serde_json::to_writer(&mut buf, r).map_err(std::io::Error::other)?;
        buf.push(b'\n');
    }
    f.write_all(&buf)?;
    f.sync_data()
}

fn spooled_rows(spool: &Path) -> usize {
    std::fs::File::open(spool).map(|f| std::io::BufReader::new(f).lines().count()).unwrap_or(0)
}

/// Inserts every spooled row; empties the spool if all went in. Returns the
/// rows still waiting.
async fn drain(store: &Store, spool: &Path) -> usize {
    let rows = match read(spool) {
        Ok(rows) => rows,
        Err(e) => {
            tracing::error!("cannot read the ledger spool {}: {e}", spool.display());
            return 0;
        }
    };
    if rows.is_empty() {
        return 0;
    }
    for chunk in rows.chunks(BATCH) {
        match store.insert_usage(chunk).await {
            Ok(_) => {}
            Err(e) if e.is_unavailable() => {
                tracing::warn!(waiting = rows.len(), "usage rows stay in the spool until Postgres is back: {e}");
                return rows.len();
            }
            // Refused: find the offending rows one by one and set them aside.
            Err(_) => {
                for row in chunk {
                    match store.insert_usage(std::slice::from_ref(row)).await {
                        Ok(_) => {}
                        Err(e) if e.is_unavailable() => return rows.len(),
                        Err(e) => reject(spool, row, &e.to_string()),
                    }
                }
            }
        }
    }
    match std::fs::OpenOptions::new().write(true).open(spool).and_then(|f| {
        f.set_len(0)?;
        f.sync_all()
    }) {
        Ok(()) => 0,
        Err(e) => {
            // Harmless: the rows are in Postgres and inserts are idempotent.
            tracing::warn!("cannot empty the ledger spool: {e}");
            0
        }
    }
}

/// Keeps a row the database refuses for good, with the reason.
fn reject(spool: &Path, row: &UsageRecord, reason: &str) {
    let path = spool.with_extension("rejected");
    tracing::error!(request = %row.id, "the database refuses a usage row ({reason}); kept in {}", path.display());
    let line = serde_json::json!({ "reason": reason, "row": row }).to_string() + "\n";
    let written =
        private().append(true).open(&path).and_then(|mut f| f.write_all(line.as_bytes()).and_then(|_| f.sync_data()));
    if let Err(e) = written {
        tracing::error!("cannot keep the refused row in {}: {e}", path.display());
    }
}

fn read(spool: &Path) -> std::io::Result<Vec<UsageRecord>> {
    let f = match std::fs::File::open(spool) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut rows = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(r) => rows.push(r),
            // A torn last line (a crash mid-write): skip it, keep the rest.
            Err(e) => tracing::error!("ledger spool line {} is unreadable and skipped: {e}", i + 1),
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: u8) -> UsageRecord {
        UsageRecord {
            id: cachet_tenants::RequestId(uuid::Uuid::from_bytes([n; 16])),
            tenant: cachet_tenants::TenantId(uuid::Uuid::from_bytes([1; 16])),
            session_id: None,
            task_id: None,
            model: "m".into(),
            endpoint: cachet_tenants::Endpoint::ChatCompletions,
            prompt_tokens: 3,
            cached_tokens: 1,
            computed_tokens: 2,
            output_tokens: 4,
            queue_ms: 1.0,
            ttft_ms: Some(2.0),
            e2e_ms: 3.0,
            compute_seconds: 0.5,
            cost: 0.1,
            status: cachet_tenants::RequestStatus::Ok,
            finish_reason: Some(cachet_tenants::FinishReason::Stop),
            created_at: chrono::Utc::now(),
            slo_class: Some(cachet_tenants::SloClass::Interactive),
            slo_met: Some(true),
            kv_transfer_ms: None,
            drafted_tokens: 0,
            accepted_tokens: 0,
        }
    }

    #[test]
    fn the_spool_round_trips_and_survives_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("spool.jsonl");
        append(&spool, &[row(1), row(2)]).unwrap();
        // A crash in the middle of a write leaves half a line.
        std::fs::OpenOptions::new().append(true).open(&spool).unwrap().write_all(b"{\"id\": \"tor").unwrap();
        append(&spool, &[row(3)]).unwrap();
        let rows = read(&spool).unwrap();
        assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [row(1).id, row(2).id, row(3).id]);
        assert_eq!(spooled_rows(&spool), 4);
        reject(&spool, &row(9), "no such tenant");
        let kept = std::fs::read_to_string(spool.with_extension("rejected")).unwrap();
        assert!(kept.contains("no such tenant") && kept.contains(&row(9).id.to_string()));
    }
}
