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

/// Refuses a folder tree that holds anything but regular files, folders and
/// links to them (a FIFO, a socket, a device): a plugin reads its model folder
/// through WASI, and a read of a named pipe would block past its deadline.
/// Links to folders are not followed (WASI does not follow links out of the
/// folder, and a link inside it is checked where it points).
pub fn check_tree(root: &Path, what: &str) -> Result<()> {
    let read = |p: &Path, e: std::io::Error| {
        Error::invalid_arg(format!("{what}: cannot read '{}': {e}", p.display()))
    };
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| read(&dir, e))? {
            let path = entry.map_err(|e| read(&dir, e))?.path();
            let own = std::fs::symlink_metadata(&path).map_err(|e| read(&path, e))?;
            if own.is_dir() {
                pending.push(path);
                continue;
            }
            // A dangling link cannot be opened, so it cannot block either.
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() && !meta.is_dir() {
                return Err(Error::invalid_arg(format!(
                    "{what}: '{}' is not a regular file or folder; a plugin reading it could \
                     block past its deadline",
                    path.display()
                )));
            }
        }
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

    #[test]
    fn a_tree_with_a_named_pipe_is_refused() {
        let dir = std::env::temp_dir().join(format!("tern-tree-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/w.bin"), "x").unwrap();
        std::os::unix::fs::symlink(dir.join("a"), dir.join("loop")).unwrap();
        std::os::unix::fs::symlink(dir.join("gone"), dir.join("dangling")).unwrap();
        check_tree(&dir, "model 'm'").unwrap();
        let fifo = dir.join("a/b/pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = check_tree(&dir, "model 'm'").unwrap_err();
        assert!(
            e.message
                .contains("a/b/pipe' is not a regular file or folder"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
