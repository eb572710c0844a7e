//! `thicket fetch ALIAS`: downloads, assembles and verifies a model of the catalogue into the
//! models directory, prints its path, and writes its tokenizer beside it in Hugging Face's
//! layout for clients that cannot reach a hub (a model published as a Hugging Face folder
//! already holds its `tokenizer.json`).

use anyhow::bail;
use engine::model::fetch::{find_alias, models_dir};

use super::announce;

/// Runs `thicket fetch`.
pub fn run(alias: &str) -> anyhow::Result<()> {
    let Some(model) = find_alias(alias) else {
        bail!(
            "unknown model alias '{alias}' (known: {})",
            engine::model::fetch::alias_names().join(", ")
        );
    };
    let path = engine::model::fetch::fetch(model, &models_dir())?;
    println!("{}", path.display());
    if model.is_directory() {
        return Ok(());
    }
    let (content, _) = engine::model::gguf::read_content(&path)?;
    let tokenizer = engine::ModelTokenizer::from_gguf(&content)?;
    let dir = models_dir().join(format!("{alias}.tokenizer"));
    tokenizer.export_hf(&dir)?;
    announce(&format!("tokenizer for clients: {}", dir.display()));
    Ok(())
}
