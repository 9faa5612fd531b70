//! Files a model's config names (label files, warmup data, initial state):
//! read only from inside the model's folder — a symbolic link may not lead
//! out of it — and only when they are regular files, so that a config cannot
//! turn `/etc/passwd` into class labels and a named pipe cannot hold a load
//! forever.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where `relative` (below `base`, itself below the model folder `root`)
/// really is, checked: inside `root` after every link is followed, and a
/// regular file. `what` names the file in errors ("label_filename 'x'").
pub fn resolve_inside(root: &Path, base: &Path, relative: &str, what: &str) -> Result<PathBuf> {
    let path = base.join(relative);
    let real = std::fs::canonicalize(&path).map_err(|e| {
        Error::invalid_arg(format!("{what}: cannot read '{}': {e}", path.display()))
    })?;
    let root = std::fs::canonicalize(root).map_err(|e| {
        Error::invalid_arg(format!(
            "{what}: cannot open the model folder '{}': {e}",
            root.display()
        ))
    })?;
    if !real.starts_with(&root) {
        return Err(Error::invalid_arg(format!(
            "{what}: '{}' leads to '{}', outside the model's folder",
            path.display(),
            real.display()
        )));
    }
    check_regular(&real, what)?;
    Ok(real)
}

/// Reads a file [`resolve_inside`] accepts.
pub fn read_inside(root: &Path, base: &Path, relative: &str, what: &str) -> Result<Vec<u8>> {
    let real = resolve_inside(root, base, relative, what)?;
    std::fs::read(&real)
        .map_err(|e| Error::invalid_arg(format!("{what}: cannot read '{}': {e}", real.display())))
}

/// Refuses anything but a regular file (a FIFO, a device, a folder): opening
/// one could block the load that reads it.
pub fn check_regular(path: &Path, what: &str) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| {
        Error::invalid_arg(format!("{what}: cannot read '{}': {e}", path.display()))
    })?;
    if !meta.is_file() {
        return Err(Error::invalid_arg(format!(
            "{what}: '{}' is not a regular file",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_out_of_the_folder_and_special_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("tern-files-{}", std::process::id()));
        let model = dir.join("m");
        std::fs::create_dir_all(model.join("sub")).unwrap();
        std::fs::write(model.join("labels.txt"), "a\nb\n").unwrap();
        std::fs::write(dir.join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), model.join("out")).unwrap();
        std::os::unix::fs::symlink(model.join("labels.txt"), model.join("sub/in")).unwrap();
        assert_eq!(
            read_inside(&model, &model, "labels.txt", "l").unwrap(),
            b"a\nb\n"
        );
        // A link that stays inside the folder is fine.
        assert!(read_inside(&model, &model.join("sub"), "in", "l").is_ok());
        let e = read_inside(&model, &model, "out", "label_filename 'out'").unwrap_err();
        assert!(e.message.contains("outside the model's folder"), "{e}");
        let e = read_inside(&model, &model, "sub", "l").unwrap_err();
        assert!(e.message.contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
