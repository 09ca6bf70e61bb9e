//! Files beneath a directory held open, never reached through a link another user planted.
//!
//! pyfleet often runs as root beside users who are not. A path names a file only at the moment
//! it is resolved; a directory another user can write may hold, by then, a symbolic link to
//! `/etc` or a swapped subdirectory. So:
//!
//! - [`Beneath::open`] resolves a directory's path one component at a time, following a
//!   symbolic link only when its owner is trusted (root, pyfleet's user, or the user who ran
//!   pyfleet through sudo: nobody else can have made it), and holds the directory open.
//! - Every later read and write names a path *beneath* that descriptor, resolved by the kernel
//!   (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): no symbolic link, no `..` out
//!   of it, no magic link, whatever was planted since. New files and directories are created
//!   there (`O_EXCL`, `mkdirat`), renamed within it (`renameat`) and removed within it
//!   (`unlinkat`), never through a link.
//! - [`Beneath::require_private`] is what a directory pyfleet keeps its output in must be:
//!   owned by pyfleet's user and writable by nobody else.

use super::FileMode;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Most symbolic links followed while opening one directory (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// A directory held open; see the module documentation.
#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    /// Its path as given, for messages only: never resolved again.
    path: PathBuf,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Directory,
    File,
    Other,
}

impl Beneath {
    /// Opens directory `path`, following only symbolic links a trusted user owns (see the
    /// module documentation). The error says which component is refused and why.
    pub fn open(path: &Path) -> io::Result<Beneath> {
        let fd = open_trusted_directory(path)?;
        Ok(Beneath {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// [`Beneath::open`], creating `path`'s last component first (with `mode`'s directory
    /// bits, whatever the umask) when it does not exist; a missing parent is an error.
    pub fn open_or_create(path: &Path, mode: FileMode) -> io::Result<Beneath> {
        match Beneath::open(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => return other,
        }
        let (parent, name) = split_last(path)?;
        let parent = Beneath::open(parent)?;
        parent.create_dir(name, mode)?;
        parent.subdirectory(name).map(|b| Beneath {
            fd: b.fd,
            path: path.to_path_buf(),
        })
    }

    /// The path it was opened by (for messages: it may name something else by now).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// That the directory is pyfleet's own: owned by its user, and neither group nor others
    /// may write in it. Else why not, and what to do, in one line.
    pub fn require_private(&self) -> Result<(), String> {
        self.require_private_to(nix::unistd::geteuid().as_raw())
    }

    /// [`Beneath::require_private`] for the user pyfleet is about to become (`--user`).
    pub fn require_private_to(&self, me: u32) -> Result<(), String> {
        let st = nix::sys::stat::fstat(&self.fd).map_err(|e| e.to_string())?;
        if st.st_uid != me {
            return Err(format!(
                "it belongs to uid {}, not to pyfleet's user (uid {me}): give a directory of \
                 pyfleet's user (or a path that does not exist yet: pyfleet creates it, private)",
                st.st_uid
            ));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(format!(
                "other users may write in it (mode {:o}): `chmod go-w` it, or give a private \
                 directory",
                st.st_mode & 0o7777
            ));
        }
        Ok(())
    }

    /// Makes the directory `owner`'s (one pyfleet just created, for the user it becomes).
    pub fn give_to(&self, owner: super::Owner) -> io::Result<()> {
        nix::unistd::fchown(
            &self.fd,
            Some(nix::unistd::Uid::from_raw(owner.uid)),
            Some(nix::unistd::Gid::from_raw(owner.gid)),
        )?;
        Ok(())
    }

    /// The kernel's way to `relative` beneath this directory: no symbolic link, no magic
    /// link, nothing outside it.
    fn resolve(&self, relative: &Path, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .mode(mode)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        Ok(nix::fcntl::openat2(&self.fd, relative, how)?)
    }

    /// Subdirectory `relative`, held open in turn.
    pub fn subdirectory(&self, relative: &Path) -> io::Result<Beneath> {
        let fd = self.resolve(
            relative,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )?;
        Ok(Beneath {
            fd,
            path: self.path.join(relative),
        })
    }

    /// The regular file `relative` opened for reading (without waiting on a FIFO), with its
    /// metadata; anything else is an error.
    pub fn open_regular(&self, relative: &Path) -> io::Result<(std::fs::File, std::fs::Metadata)> {
        let fd = self.resolve(relative, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        Ok((file, meta))
    }

    /// Whether `relative` is a regular file (not through a link).
    pub fn is_file(&self, relative: &Path) -> bool {
        self.kind(relative) == Some(Kind::File)
    }

    /// What `relative` is, if it is there (a link is `Other`, never followed).
    pub fn kind(&self, relative: &Path) -> Option<Kind> {
        self.stat(relative).ok().map(|st| kind_of(&st))
    }

    /// `relative`'s metadata, the link itself for a link.
    fn stat(&self, relative: &Path) -> io::Result<FileStat> {
        let (dir, name) = self.parent_of(relative)?;
        Ok(nix::sys::stat::fstatat(
            &dir,
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )?)
    }

    /// Creates the new file `relative` (never an existing one) with exactly `mode`'s file
    /// bits, whatever the umask.
    pub fn create_new(&self, relative: &Path, mode: FileMode) -> io::Result<std::fs::File> {
        let bits = Mode::from_bits_truncate(mode.file());
        let fd = self.resolve(
            relative,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            bits,
        )?;
        nix::sys::stat::fchmod(&fd, bits)?;
        Ok(std::fs::File::from(fd))
    }

    /// Creates the new directory `relative` with exactly `mode`'s directory bits.
    pub fn create_dir(&self, relative: &Path, mode: FileMode) -> io::Result<()> {
        let bits = Mode::from_bits_truncate(mode.directory());
        let (dir, name) = self.parent_of(relative)?;
        nix::sys::stat::mkdirat(&dir, name, bits)?;
        let created = self.resolve(
            relative,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )?;
        nix::sys::stat::fchmod(&created, bits)?;
        Ok(())
    }

    /// Renames `from` to `to`, both names directly in this directory (an existing `to`, if
    /// not a non-empty directory, is replaced; a link there is replaced, not followed).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (from, to) = (single_name(from)?, single_name(to)?);
        nix::fcntl::renameat(&self.fd, from, &self.fd, to)?;
        Ok(())
    }

    /// Renames `from` to `to` in this directory unless `to` exists (then `AlreadyExists`):
    /// the way to publish a file fully written, when another writer may be publishing its own.
    pub fn rename_new(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (from, to) = (single_name(from)?, single_name(to)?);
        nix::fcntl::renameat2(
            &self.fd,
            from,
            &self.fd,
            to,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )?;
        Ok(())
    }

    /// Removes `relative` and, for a directory, everything in it; never following a link (a
    /// link is removed itself).
    pub fn remove_all(&self, relative: &Path) -> io::Result<()> {
        use nix::unistd::UnlinkatFlags;
        let (dir, name) = self.parent_of(relative)?;
        if self.kind(relative) == Some(Kind::Directory) {
            let inner = self.subdirectory(relative)?;
            for (entry, _) in inner.entries()? {
                inner.remove_all(Path::new(&entry))?;
            }
            nix::unistd::unlinkat(&dir, name, UnlinkatFlags::RemoveDir)?;
        } else {
            nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)?;
        }
        Ok(())
    }

    /// The names in this directory (not `.` and `..`) and what each is (links not followed).
    pub fn entries(&self) -> io::Result<Vec<(OsString, Kind)>> {
        let fd = self.resolve(
            Path::new("."),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )?;
        let mut dir = nix::dir::Dir::from_fd(fd)?;
        let mut found = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
            if name == "." || name == ".." {
                continue;
            }
            let kind = match entry.file_type() {
                Some(nix::dir::Type::Directory) => Kind::Directory,
                Some(nix::dir::Type::File) => Kind::File,
                Some(_) => Kind::Other,
                None => self.kind(Path::new(&name)).unwrap_or(Kind::Other),
            };
            found.push((name, kind));
        }
        Ok(found)
    }

    /// The size of regular file `relative` (0 for anything else).
    pub fn file_len(&self, relative: &Path) -> u64 {
        self.stat(relative)
            .ok()
            .filter(|st| kind_of(st) == Kind::File)
            .map_or(0, |st| st.st_size as u64)
    }

    /// Flushes the directory itself (new names, renames) to disk.
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(&self.fd)?;
        Ok(())
    }

    /// The directory holding `relative` (held open beneath this one) and its last name.
    fn parent_of<'a>(&self, relative: &'a Path) -> io::Result<(OwnedFd, &'a OsStr)> {
        let name = relative
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let parent = match relative.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = self.resolve(parent, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
        Ok((dir, name))
    }
}

/// A name with no `/`, not `.` or `..`.
fn single_name(name: &OsStr) -> io::Result<&OsStr> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a single name",
        ));
    }
    Ok(name)
}

fn kind_of(st: &FileStat) -> Kind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Kind::Directory,
        SFlag::S_IFREG => Kind::File,
        _ => Kind::Other,
    }
}

/// `path`'s parent (`.` for a bare name) and its last component; an error for `/` or `..`.
fn split_last(path: &Path) -> io::Result<(&Path, &Path)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no directory name"))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((parent, Path::new(name)))
}

/// Whether a symbolic link owned by `uid` may be followed: root's, pyfleet's user's, or the
/// sudo invoker's (who asked for the path). Nobody can make a link owned by another user.
fn trusted_owner(uid: u32) -> bool {
    uid == 0
        || uid == nix::unistd::geteuid().as_raw()
        || super::Owner::sudo_invoker().is_some_and(|o| o.uid == uid)
}

/// Opens directory `path` component by component (see [`Beneath::open`]).
fn open_trusted_directory(path: &Path) -> io::Result<OwnedFd> {
    let walk = |flags: OFlag| flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let open_at = |dir: &OwnedFd, name: &OsStr, flags: OFlag| -> io::Result<OwnedFd> {
        Ok(nix::fcntl::openat(dir, name, walk(flags), Mode::empty())?)
    };
    let root = || -> io::Result<OwnedFd> {
        Ok(nix::fcntl::open(
            "/",
            walk(OFlag::O_PATH | OFlag::O_DIRECTORY),
            Mode::empty(),
        )?)
    };
    let mut current = match path.is_absolute() {
        true => root()?,
        false => nix::fcntl::open(".", walk(OFlag::O_PATH | OFlag::O_DIRECTORY), Mode::empty())?,
    };
    let mut pending: Vec<OsString> = components(path);
    pending.reverse();
    let mut shown = PathBuf::from(if path.is_absolute() { "/" } else { "" });
    let mut links = 0;
    while let Some(name) = pending.pop() {
        if name == "." {
            continue;
        }
        shown.push(&name);
        // The component itself, not followed: a link is looked at before anything goes
        // through it; a directory is held from here on.
        let here = open_at(&current, &name, OFlag::O_PATH).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", shown.display()),
            ),
            _ => io::Error::new(e.kind(), format!("{}: {e}", shown.display())),
        })?;
        let st = nix::sys::stat::fstat(&here)?;
        match kind_of(&st) {
            Kind::Directory => current = here,
            _ if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK => {
                if !trusted_owner(st.st_uid) {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "{} is a symbolic link owned by uid {}, which another user could \
                             have planted: pyfleet does not follow it (give the path it points \
                             to, if that is meant)",
                            shown.display(),
                            st.st_uid
                        ),
                    ));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = nix::fcntl::readlinkat(&here, "")?;
                let target = PathBuf::from(target);
                if target.is_absolute() {
                    current = root()?;
                }
                let mut more = components(&target);
                more.reverse();
                pending.extend(more);
                shown.pop();
            }
            kind => {
                return Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!(
                        "{} is {}, not a directory",
                        shown.display(),
                        if kind == Kind::File {
                            "a file"
                        } else {
                            "something else"
                        }
                    ),
                ))
            }
        }
    }
    Ok(nix::fcntl::openat(
        &current,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

/// The names of `path`'s components in order: `..` kept (the real parent of what is held),
/// the root and `.` left out.
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

impl AsFd for Beneath {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn reads_and_writes_stay_beneath_and_follow_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), "s").unwrap();
        let b = Beneath::open(dir.path()).unwrap();
        b.create_dir(Path::new("a"), FileMode::default()).unwrap();
        let a = b.subdirectory(Path::new("a")).unwrap();
        use std::io::Write;
        a.create_new(Path::new("f"), FileMode::default())
            .unwrap()
            .write_all(b"x")
            .unwrap();
        assert!(b.is_file(Path::new("a/f")));
        assert_eq!(b.file_len(Path::new("a/f")), 1);
        // Planted links: a directory and a file, absolute and relative.
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", dir.path().join("a/passwd")).unwrap();
        for planted in ["link/secret", "a/passwd", "../x", "/etc/passwd"] {
            assert!(b.open_regular(Path::new(planted)).is_err(), "{planted}");
        }
        assert!(b.subdirectory(Path::new("link")).is_err());
        assert!(b
            .create_new(Path::new("link/new"), FileMode::default())
            .is_err());
        assert!(b
            .create_dir(Path::new("link/new"), FileMode::default())
            .is_err());
        assert!(!outside.path().join("new").exists());
        assert_eq!(b.kind(Path::new("link")), Some(Kind::Other));
        // Renames and removal within, never through.
        b.rename(OsStr::new("a"), OsStr::new("b")).unwrap();
        assert!(b.rename(OsStr::new("b"), OsStr::new("../b")).is_err());
        b.remove_all(Path::new("link")).unwrap();
        assert!(
            outside.path().join("secret").exists(),
            "the link alone goes"
        );
        b.remove_all(Path::new("b")).unwrap();
        assert!(b.entries().unwrap().is_empty());
    }

    #[test]
    fn only_links_of_trusted_owners_are_followed_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("mine")).unwrap();
        // A link of this user's: followed.
        assert!(Beneath::open(&dir.path().join("mine")).is_ok());
        assert!(Beneath::open(&dir.path().join("missing")).is_err());
        fs::write(dir.path().join("file"), "").unwrap();
        assert!(Beneath::open(&dir.path().join("file")).is_err());
        // A link of another user's: refused, when this test can make one (as root).
        if nix::unistd::geteuid().is_root() {
            let theirs = dir.path().join("theirs");
            std::os::unix::fs::symlink("real", &theirs).unwrap();
            nix::unistd::fchownat(
                nix::fcntl::AT_FDCWD,
                &theirs,
                Some(nix::unistd::Uid::from_raw(65534)),
                None,
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .unwrap();
            let e = Beneath::open(&theirs.join("x")).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        }
    }

    #[test]
    fn a_private_directory_is_its_users_and_nobody_elses() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let b = Beneath::open(dir.path()).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert!(b.require_private().is_ok());
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(b.require_private().unwrap_err().contains("chmod go-w"));
        let created =
            Beneath::open_or_create(&dir.path().join("new"), FileMode::default()).unwrap();
        assert!(created.require_private().is_ok());
    }
}
