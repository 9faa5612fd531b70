//! Version folders and `version_policy` (latest / all / specific).

use std::path::Path;

use tern_core::config::pb::model_version_policy::PolicyChoice;
use tern_core::config::ModelConfig;

/// Numeric version folders of a model, ascending. Non-numeric names and names
/// starting with `0` are ignored, as Triton does.
pub fn list_versions(model_dir: &Path) -> Vec<i64> {
    let mut out: Vec<i64> = std::fs::read_dir(model_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if name.starts_with('0') || !name.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            name.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// The versions a (normalised) config asks for, ascending. `specific` may
/// name versions that do not exist; loading reports those.
pub fn select_versions(cfg: &ModelConfig, available: &[i64]) -> Vec<i64> {
    match cfg
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        Some(PolicyChoice::All(_)) => available.to_vec(),
        Some(PolicyChoice::Specific(s)) => {
            let mut v = s.versions.clone();
            v.sort_unstable();
            v.dedup();
            v
        }
        Some(PolicyChoice::Latest(l)) => {
            let n = (l.num_versions.max(1) as usize).min(available.len());
            available[available.len() - n..].to_vec()
        }
        None => available.last().copied().into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    #[test]
    fn lists_numeric_folders_only() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["1", "3", "10", "01", "0", "abc", "2x"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("7"), b"file").unwrap();
        assert_eq!(list_versions(dir.path()), vec![1, 3, 10]);
    }

    #[test]
    fn policies() {
        let avail = [1, 2, 5];
        let pick = |p: &str| select_versions(&parse_pbtxt(p).unwrap(), &avail);
        assert_eq!(pick(""), vec![5]);
        assert_eq!(
            pick("version_policy: { latest: { num_versions: 2 } }"),
            vec![2, 5]
        );
        assert_eq!(
            pick("version_policy: { latest: { num_versions: 9 } }"),
            vec![1, 2, 5]
        );
        assert_eq!(pick("version_policy: { all: {} }"), vec![1, 2, 5]);
        assert_eq!(
            pick("version_policy: { specific: { versions: [5, 1, 1] } }"),
            vec![1, 5]
        );
    }
}
