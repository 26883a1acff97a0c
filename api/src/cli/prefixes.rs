//! `cachet public-prefixes`: register, list and remove public prefixes in the database (every
//! running server hears of the change and renders it with its own model; see `api/src/prefixes`).

use super::serve::DataArgs;
use crate::startup::database;
use anyhow::{bail, Context};

#[derive(Debug, clap::Subcommand)]
pub enum PublicPrefixesCommand {
    /// Register a prefix from a JSON file: `{"messages": […], "tools": […]}`, `{"text": "…"}` or
    /// `{"tokens": […]}` (a chat request body works: other fields are ignored); prints its id.
    Add {
        name: String,
        /// The JSON file ("-": standard input).
        #[arg(long)]
        file: String,
        /// Do not compute it into the cache at start (it is computed when first sent).
        #[arg(long)]
        no_prewarm: bool,
    },
    /// List the registered prefixes (those in the configuration are not listed here).
    List,
    /// Remove a registered prefix.
    Remove { id: String },
}

/// The source in a file: the fields of a source, from a chat request body or a source alone.
fn source_of(text: &str) -> anyhow::Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_str(text).context("the file is not JSON")?;
    let map = v.as_object().context("the file must hold a JSON object")?;
    let source: serde_json::Map<String, serde_json::Value> = ["messages", "tools", "text", "tokens"]
        .iter()
        .filter_map(|k| map.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let value = serde_json::Value::Object(source);
    crate::prefixes::Source::parse(&value).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(value)
}

pub fn run(data: DataArgs, cmd: PublicPrefixesCommand) -> anyhow::Result<()> {
    let settings = data.settings()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let db = database(&settings).await?;
        match cmd {
            PublicPrefixesCommand::Add { name, file, no_prewarm } => {
                let text = if file == "-" {
                    std::io::read_to_string(std::io::stdin())?
                } else {
                    std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?
                };
                let source = source_of(&text)?;
                let row = db.store.add_public_prefix(name.trim(), &source, !no_prewarm).await?;
                println!("{}", row.id);
                eprintln!("registered public prefix {:?}; running servers render it with their model", row.name);
            }
            PublicPrefixesCommand::List => {
                for r in db.store.list_public_prefixes().await? {
                    if data.json {
                        println!("{}", serde_json::to_string(&r)?);
                    } else {
                        let kind = ["messages", "text", "tokens"].into_iter().find(|k| r.source.get(k).is_some());
                        println!("{}\t{}\t{}\tprewarm={}", r.id, r.name, kind.unwrap_or("tools"), r.prewarm);
                    }
                }
            }
            PublicPrefixesCommand::Remove { id } => {
                let id: uuid::Uuid = id.parse().map_err(|_| anyhow::anyhow!("{id} is not a prefix id"))?;
                if !db.store.remove_public_prefix(id).await? {
                    bail!("no public prefix {id}");
                }
                eprintln!("removed public prefix {id}");
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chat_request_body_gives_its_messages_and_tools() {
        let body = r#"{"model": "m", "messages": [{"role": "system", "content": "s"}], "tools": [], "stream": true}"#;
        let v = super::source_of(body).unwrap();
        assert_eq!(v, serde_json::json!({"messages": [{"role": "system", "content": "s"}], "tools": []}));
        assert!(super::source_of(r#"{"text": "a", "tokens": [1]}"#).is_err());
        assert!(super::source_of("[1]").is_err());
    }
}
