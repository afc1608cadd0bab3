//! The namespace: directories, names and paths of the file layer, and the
//! operations on them (create, open, mkdir, rmdir, unlink, rename, readdir,
//! stat, chmod, utimes).
//!
//! There are no directory blocks. Every inode holds its own name and its
//! parent directory's slot (format version 3, [`super::format`]); the root
//! has no inode. At mount the namespace is indexed in memory (`Index`:
//! per directory, an ordered map of its names, looked up by a borrowed
//! name), and checked: every parent is a directory, no name is taken
//! twice, every directory reaches the root. So a rename, even of a
//! directory across directories, rewrites one inode (two for an exchange,
//! plus the parents' times), in one journal transaction: atomic by
//! construction, and a crash leaves either the old name or the new one.
//!
//! Paths are bytes (any but NUL; `/` separates), relative to the root
//! whether or not they start with `/`; `.` and `..` are resolved here (the
//! root's `..` is the root), a trailing `/` demands a directory. Errors carry
//! the errno POSIX gives for the same call (ENOENT, ENOTDIR, EISDIR,
//! ENOTEMPTY, EEXIST, EINVAL, EBUSY, ENAMETOOLONG).
//!
//! Symbolic links (format 7) keep their target in their inode; the index
//! holds every target, and a path is walked by name until it meets a link
//! it must follow, then resolved (`Index::resolve`) as the kernel does.
//!
//! A file unlinked (or replaced by a rename) while open keeps its data for
//! its open handles, as POSIX says: it becomes an orphan (flagged in its
//! inode, in the same transaction that removes its name), and its last
//! close frees it; a crash before that leaves the flag, and the next mount
//! frees it.

use super::check::{Named, Problems};
use super::format::{BLOCK_U64, Inode, MAX_NAME, MAX_PATH, ROOT, check_name};
use super::{File, FileSystem, Meta, Node, NodeState, Slot, file_error, now_ns};
use crate::error::{Error, Result};
use crate::hash::{IntMap, IntSet};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockWriteGuard};

/// Inode number `stat` reports for the root directory (a slot's is slot + 2).
pub const ROOT_INO: u64 = 1;

/// What a directory entry leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Child {
    /// Inode slot.
    pub slot: u32,
    /// It is a directory.
    pub dir: bool,
}

const ROOT_CHILD: Child = Child { slot: ROOT, dir: true };

/// A name in the index: one copy, shared by its directory's entries and its
/// link back (two copies of every name were a quarter of indexing them at mount).
pub(super) type Name = Arc<[u8]>;

/// A map keyed by inode slot, kept as a table by slot: slots are dense (all
/// below the inode mark), so a lookup is an index, not a hash and a probe
/// (the hash map of every name's link was a fifth of indexing them at mount).
#[derive(Debug)]
struct BySlot<V> {
    items: Vec<Option<V>>,
    len: usize,
}

impl<V> Default for BySlot<V> {
    fn default() -> Self {
        BySlot { items: Vec::new(), len: 0 }
    }
}

impl<V> BySlot<V> {
    fn get(&self, slot: &u32) -> Option<&V> {
        self.items.get(*slot as usize)?.as_ref()
    }

    fn insert(&mut self, slot: u32, value: V) -> Option<V> {
        let at = slot as usize;
        debug_assert!(slot != ROOT, "the root has no link");
        if at >= self.items.len() {
            self.items.resize_with(at + 1, || None);
        }
        let old = self.items[at].replace(value);
        self.len += usize::from(old.is_none());
        old
    }

    fn remove(&mut self, slot: &u32) -> Option<V> {
        let old = self.items.get_mut(*slot as usize)?.take();
        self.len -= usize::from(old.is_some());
        old
    }

    /// The slots that hold a value, in order.
    fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.items.iter().enumerate().filter(|(_, v)| v.is_some()).map(|(slot, _)| slot as u32)
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Room for slots below `slots` without growing.
    fn reserve(&mut self, slots: usize) {
        self.items.reserve(slots.saturating_sub(self.items.len()));
    }
}

/// The in-memory index of every name: built at mount, changed with the
/// inodes under the metadata lock.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// `parent -> name -> child`: a directory's entries by name (looked up
    /// by a borrowed name, with no copy of it).
    entries: IntMap<u32, BTreeMap<Name, Child>>,
    /// Number of names.
    names: usize,
    /// `slot -> (parent, name)` for every inode that holds a name: a linked
    /// file or directory, or a hard link's alias (an orphan has none).
    links: BySlot<(u32, Name)>,
    /// Each symbolic link's target, by slot.
    targets: IntMap<u32, Vec<u8>>,
    /// The slots of named pipes (FIFOs).
    fifos: IntSet<u32>,
    /// The alias slots holding a file's other names (hard links), by the
    /// file's slot; the file's own inode holds one name while it has any.
    aliases: IntMap<u32, Vec<u32>>,
    /// The file each alias slot names.
    alias_of: IntMap<u32, u32>,
}

/// What [`Index::walk_plain`] gives back where a link is to be followed
/// (no errno is 0: matched as `Err((0, _))`).
const FOLLOW: Refusal = (0, "a symbolic link to follow");

/// Most names one file has (its own and its hard links'): ext4's `EXT4_LINK_MAX`.
pub const MAX_HARD_LINKS: u32 = 65000;

/// Most symbolic links one path resolution follows (Linux's `MAXSYMLINKS`).
const MAX_LINKS_FOLLOWED: usize = 40;

/// Where a path leads once its symbolic links are followed
/// ([`FileSystem::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// A path inside the file system, from its root (`/a/b`), with no link
    /// on the way (the last component may be one when it was not followed);
    /// a trailing `/` is kept.
    Inside(Vec<u8>),
    /// A link with an absolute target: the path it leads to, with the rest
    /// of the original path after it. Absolute in the process's namespace,
    /// not this file system's: the caller (the interposer) routes it.
    Absolute(Vec<u8>),
    /// A link whose relative target climbs above the root: the path from
    /// the directory the file system is mounted on, starting with `..`.
    Above(Vec<u8>),
}

/// Where a path leads.
#[derive(Debug, Clone)]
pub(super) struct Walk<'a> {
    /// The directory the last component is looked up in.
    pub parent: u32,
    /// The last component; `None` when the path names a directory by `/`,
    /// `.` or `..` (a name that cannot be created, removed or renamed).
    /// Borrowed from the path where no link was followed: a walk copies
    /// nothing (a `tar c` walks five times per file).
    pub name: Option<Cow<'a, [u8]>>,
    /// What the path names now (a directory if the path ends in `/`).
    pub found: Option<Child>,
}

/// A path that does not resolve: errno and why.
type Refusal = (i32, &'static str);

impl Index {
    /// Adds an entry; false if the name is taken.
    pub fn insert(&mut self, parent: u32, name: &[u8], child: Child) -> bool {
        self.insert_name(parent, Name::from(name), child)
    }

    /// [`Index::insert`] of a name already shared (a mount's scan made it).
    fn insert_name(&mut self, parent: u32, name: Name, child: Child) -> bool {
        use std::collections::btree_map::Entry;
        match self.entries.entry(parent).or_default().entry(Arc::clone(&name)) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                v.insert(child);
                self.names += 1;
                let old = self.links.insert(child.slot, (parent, name));
                debug_assert!(old.is_none(), "slot {} linked twice", child.slot);
                true
            }
        }
    }

    /// Adds another name of file `file`, held by inode `alias`; false if the
    /// name is taken.
    pub fn insert_alias(&mut self, parent: u32, name: Name, alias: u32, file: u32) -> bool {
        use std::collections::btree_map::Entry;
        match self.entries.entry(parent).or_default().entry(Arc::clone(&name)) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                v.insert(Child { slot: file, dir: false });
                self.names += 1;
                let old = self.links.insert(alias, (parent, name));
                debug_assert!(old.is_none(), "slot {alias} linked twice");
                self.aliases.entry(file).or_default().push(alias);
                self.alias_of.insert(alias, file);
                true
            }
        }
    }

    /// The inode slot that holds entry `name` of `parent`: the slot it leads
    /// to, or the alias of it that carries this name (a hard link).
    pub fn holder(&self, parent: u32, name: &[u8]) -> Option<u32> {
        let child = self.get(parent, name)?;
        let holds = |slot: &u32| self.links.get(slot).is_some_and(|(p, n)| *p == parent && n[..] == *name);
        if holds(&child.slot) {
            return Some(child.slot);
        }
        self.aliases.get(&child.slot)?.iter().copied().find(holds)
    }

    /// The alias slots holding file `file`'s other names (hard links).
    pub fn aliases(&self, file: u32) -> &[u32] {
        self.aliases.get(&file).map_or(&[], |a| &a[..])
    }

    /// Records that `slot` is a symbolic link to `target`.
    pub fn set_target(&mut self, slot: u32, target: Vec<u8>) {
        self.targets.insert(slot, target);
    }

    /// Records that `slot` is a named pipe (a FIFO).
    pub fn set_fifo(&mut self, slot: u32) {
        self.fifos.insert(slot);
    }

    /// Whether `slot` is a named pipe.
    pub fn is_fifo(&self, slot: u32) -> bool {
        self.fifos.contains(&slot)
    }

    /// `slot` holds no symbolic link or FIFO any more (its inode is free).
    pub fn forget_kind(&mut self, slot: u32) {
        self.targets.remove(&slot);
        self.fifos.remove(&slot);
    }

    /// The target of symbolic link `slot`.
    pub fn target(&self, slot: u32) -> Option<&[u8]> {
        self.targets.get(&slot).map(|t| &t[..])
    }

    /// Removes the entry `slot` holds (nothing if it has none); an alias
    /// is forgotten with it.
    pub fn remove_slot(&mut self, slot: u32) {
        if let Some((parent, name)) = self.links.remove(&slot) {
            let file = match self.alias_of.remove(&slot) {
                Some(file) => {
                    let aliases = self.aliases.get_mut(&file).expect("an alias's file has aliases");
                    aliases.retain(|&a| a != slot);
                    if aliases.is_empty() {
                        self.aliases.remove(&file);
                    }
                    file
                }
                None => slot,
            };
            let dir = self.entries.get_mut(&parent).expect("a linked slot's directory has entries");
            let gone = dir.remove(&name);
            debug_assert_eq!(gone.map(|c| c.slot), Some(file));
            if dir.is_empty() {
                self.entries.remove(&parent);
            }
            self.names -= 1;
        }
    }

    /// The entry `name` of directory `parent`.
    pub fn get(&self, parent: u32, name: &[u8]) -> Option<Child> {
        self.entries.get(&parent)?.get(name).copied()
    }

    /// Where `slot` is linked.
    pub fn link_of(&self, slot: u32) -> Option<&(u32, Name)> {
        self.links.get(&slot)
    }

    /// The entries of directory `dir`, by name.
    pub fn children(&self, dir: u32) -> impl Iterator<Item = (&[u8], Child)> {
        self.entries.get(&dir).into_iter().flatten().map(|(n, c)| (&n[..], *c))
    }

    /// Up to `n` entries of `dir` before `name`, nearest first (`readdir`'s order, backwards).
    pub fn before(&self, dir: u32, name: &[u8], n: usize) -> impl Iterator<Item = &[u8]> {
        use std::ops::Bound::{Excluded, Unbounded};
        let range = self.entries.get(&dir).map(|e| e.range::<[u8], _>((Unbounded, Excluded(name))));
        range.into_iter().flatten().rev().take(n).map(|(n, _)| &n[..])
    }

    /// Up to `n` entries of `dir` after `name`, in `readdir`'s order.
    pub fn after(&self, dir: u32, name: &[u8], n: usize) -> impl Iterator<Item = Child> + '_ {
        use std::ops::Bound::{Excluded, Unbounded};
        let range = self.entries.get(&dir).map(|e| e.range::<[u8], _>((Excluded(name), Unbounded)));
        range.into_iter().flatten().take(n).map(|(_, c)| *c)
    }

    /// Whether directory `dir` has no entries.
    pub fn is_empty_dir(&self, dir: u32) -> bool {
        self.children(dir).next().is_none()
    }

    /// The parent of directory `dir` (the root's is the root).
    pub fn parent_of(&self, dir: u32) -> u32 {
        if dir == ROOT { ROOT } else { self.links.get(&dir).map_or(ROOT, |(p, _)| *p) }
    }

    /// Whether `dir` is `ancestor` or lies below it.
    pub fn is_within(&self, mut dir: u32, ancestor: u32) -> bool {
        for _ in 0..=self.links.len() {
            if dir == ancestor {
                return true;
            }
            if dir == ROOT {
                return false;
            }
            dir = self.parent_of(dir);
        }
        false
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.names
    }

    /// The path of `slot` from the root, without a leading `/`; `None` for an orphan.
    pub fn path_of(&self, slot: u32) -> Option<Vec<u8>> {
        if slot == ROOT {
            return Some(Vec::new());
        }
        let mut parts = Vec::new();
        let mut at = slot;
        while at != ROOT {
            let (parent, name) = self.links.get(&at)?;
            parts.push(&name[..]);
            at = *parent;
            if parts.len() > self.links.len() {
                return None; // a loop (mount refuses those): never spin
            }
        }
        parts.reverse();
        Some(parts.join(&b'/'))
    }

    /// Every linked slot whose chain of parents never reaches the root (a
    /// loop of directories). Each chain is walked once: every slot on it
    /// takes its verdict (a mount of 8,759 files spent 7% of its time
    /// building each one's whole path to learn this).
    fn not_reaching_root(&self) -> Vec<u32> {
        // What is known of each slot, in a table by slot (a hash map of them was a
        // twentieth of a mount): 0 not yet, then REACHES or LOST.
        const REACHES: u8 = 1;
        const LOST: u8 = 2;
        let mut known = vec![0u8; self.links.items.len()];
        let verdict_of = |known: &[u8], at: u32| match at {
            ROOT => REACHES,
            at => known.get(at as usize).copied().unwrap_or(LOST),
        };
        let mut lost = Vec::new();
        let mut chain = Vec::new();
        for slot in self.links.keys() {
            let mut at = slot;
            let verdict = loop {
                match verdict_of(&known, at) {
                    0 => {}
                    known => break known,
                }
                if chain.len() > self.links.len() {
                    break LOST; // a loop: never spin
                }
                chain.push(at);
                match self.links.get(&at) {
                    Some(&(parent, _)) => at = parent,
                    None => break LOST,
                }
            };
            for s in chain.drain(..) {
                known[s as usize] = verdict;
            }
            if verdict == LOST {
                lost.push(slot);
            }
        }
        lost
    }

    /// Resolves `path`, following the symbolic links on the way, and the
    /// last name's if `follow` (or `.` or `..` come after it). A link that
    /// leads out of the file system is refused with `EXDEV` (the interposer
    /// asks [`Index::resolve`] first and routes such paths itself).
    pub fn walk<'a>(&self, path: &'a [u8], follow: bool) -> std::result::Result<Walk<'a>, Refusal> {
        match self.walk_plain(path, Some(follow)) {
            Err((0, _)) => {}
            done => return done,
        }
        match self.follow_links(path, follow)? {
            Resolved::Inside(inside) => {
                let walk = self.walk_plain(&inside, None)?;
                Ok(Walk { name: walk.name.map(|n| Cow::Owned(n.into_owned())), ..walk })
            }
            Resolved::Absolute(_) | Resolved::Above(_) => {
                Err((libc::EXDEV, "a symbolic link on the way leads out of the file system"))
            }
        }
    }

    /// Where `path` leads once its symbolic links are followed (the last
    /// name's too if `follow`, or `.` or `..` come after it); `None` when
    /// walking it meets no link to follow (what the path names, or why it
    /// names nothing, is the caller's walk's to say).
    pub fn resolve(&self, path: &[u8], follow: bool) -> std::result::Result<Option<Resolved>, Refusal> {
        match self.walk_plain(path, Some(follow)) {
            Err((0, _)) => self.follow_links(path, follow).map(Some),
            _ => Ok(None),
        }
    }

    /// Follows the symbolic links of `path` (see [`Index::resolve`]),
    /// resolving `.` and `..` on the way as the kernel does (`..` of a
    /// link's target directory is that directory's parent). The root's `..`
    /// is the root, except in a link's target, where it leads above the file
    /// system ([`Resolved::Above`]).
    fn follow_links(&self, path: &[u8], follow: bool) -> std::result::Result<Resolved, Refusal> {
        let dir_only = path.ends_with(b"/");
        // Trailing `.` and `..` stay as they are (what they name decides what
        // `rmdir` and `create` may do); what comes before them is followed.
        let parts: Vec<&[u8]> = path.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
        let names_end = parts.iter().rposition(|c| *c != b"." && *c != b"..").map_or(0, |i| i + 1);
        let (names, dots) = parts.split_at(names_end);
        // (A trailing `/` alone does not follow the last link: `rmdir("link/")`
        // is ENOTDIR, as on Linux.)
        let follow = follow || !dots.is_empty();
        // What is left to walk, next last; the directories walked, by name.
        let mut todo: Vec<Vec<u8>> = names.iter().rev().map(|c| c.to_vec()).collect();
        let mut at: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut followed = 0;
        let rest = |todo: &[Vec<u8>]| {
            let pieces: Vec<&[u8]> = todo.iter().rev().map(|c| &c[..]).chain(dots.iter().copied()).collect();
            let mut r = pieces.join(&b'/');
            if dir_only && !r.is_empty() {
                r.push(b'/');
            }
            r
        };
        while let Some(part) = todo.pop() {
            if part.len() > MAX_NAME {
                return Err((libc::ENAMETOOLONG, "a name is at most 255 bytes"));
            }
            match &part[..] {
                b"." => continue,
                b".." => {
                    if at.pop().is_none() && followed > 0 {
                        let mut above = b"..".to_vec();
                        let rest = rest(&todo);
                        if !rest.is_empty() {
                            above.push(b'/');
                            above.extend_from_slice(&rest);
                        }
                        return Ok(Resolved::Above(above));
                    }
                    continue;
                }
                _ => {}
            }
            let dir = at.last().map_or(ROOT, |(slot, _)| *slot);
            let last = todo.is_empty();
            let found = self.get(dir, &part);
            if let Some(target) = found.and_then(|c| self.target(c.slot))
                && (!last || follow)
            {
                followed += 1;
                if followed > MAX_LINKS_FOLLOWED {
                    return Err((libc::ELOOP, "more than 40 symbolic links on the way (a loop?)"));
                }
                if target.starts_with(b"/") {
                    let mut out = target.to_vec();
                    let rest = rest(&todo);
                    if !rest.is_empty() {
                        if !out.ends_with(b"/") {
                            out.push(b'/');
                        }
                        out.extend_from_slice(&rest);
                    }
                    return Ok(Resolved::Absolute(out));
                }
                todo.extend(target.split(|&b| b == b'/').filter(|c| !c.is_empty()).rev().map(<[u8]>::to_vec));
                continue;
            }
            if last {
                at.push((u32::MAX, part));
                break;
            }
            match found {
                None => return Err((libc::ENOENT, "a directory on the way does not exist")),
                Some(c) if !c.dir => return Err((libc::ENOTDIR, "a name on the way is a file, not a directory")),
                Some(c) => at.push((c.slot, part)),
            }
        }
        let mut out = Vec::with_capacity(path.len());
        for name in at.iter().map(|(_, n)| &n[..]).chain(dots.iter().copied()) {
            out.push(b'/');
            out.extend_from_slice(name);
        }
        if out.is_empty() || dir_only {
            out.push(b'/');
        }
        Ok(Resolved::Inside(out))
    }

    /// Resolves `path` by its names, `.` and `..` (see the module's
    /// documentation). With `links` (`Some(follow)`) it gives up with
    /// [`FOLLOW`] where a symbolic link would be followed; with `None` a
    /// link is a name like a file's (the caller resolved the path's links).
    fn walk_plain<'a>(&self, path: &'a [u8], links: Option<bool>) -> std::result::Result<Walk<'a>, Refusal> {
        if path.is_empty() {
            return Err((libc::ENOENT, "an empty path names nothing"));
        }
        if path.len() > MAX_PATH {
            return Err((libc::ENAMETOOLONG, "a path is at most 4095 bytes"));
        }
        if path.contains(&0) {
            return Err((libc::EINVAL, "a path holds no NUL byte"));
        }
        let links = links.filter(|_| !self.targets.is_empty());
        let mut parts = path.split(|&b| b == b'/').filter(|c| !c.is_empty()).peekable();
        let dir_only = path.ends_with(b"/");
        let mut dir = ROOT;
        while let Some(part) = parts.next() {
            let last = parts.peek().is_none();
            if part.len() > MAX_NAME {
                return Err((libc::ENAMETOOLONG, "a name is at most 255 bytes"));
            }
            if part == b"." || part == b".." {
                if part == b".." {
                    dir = self.parent_of(dir);
                }
                if last {
                    let found = Some(Child { slot: dir, dir: true });
                    return Ok(Walk { parent: self.parent_of(dir), name: None, found });
                }
                continue;
            }
            let found = self.get(dir, part);
            if let Some(follow) = links
                && (!last || follow)
                && found.is_some_and(|c| self.targets.contains_key(&c.slot))
            {
                return Err(FOLLOW);
            }
            if last {
                if dir_only && found.is_some_and(|c| !c.dir) {
                    return Err((libc::ENOTDIR, "a path that ends in '/' names a directory, and this is a file"));
                }
                return Ok(Walk { parent: dir, name: Some(Cow::Borrowed(part)), found });
            }
            match found {
                None => return Err((libc::ENOENT, "a directory on the way does not exist")),
                Some(c) if !c.dir => return Err((libc::ENOTDIR, "a name on the way is a file, not a directory")),
                Some(c) => dir = c.slot,
            }
        }
        Ok(Walk { parent: ROOT, name: None, found: Some(ROOT_CHILD) })
    }
}

/// What a name leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe (FIFO): a name and an inode here; its bytes pass
    /// through a kernel pipe that stands for it (the interposer opens
    /// that; [`FileSystem::open`] refuses it with `ENXIO`).
    Fifo,
}

/// One entry of a directory, as [`FileSystem::read_dir`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Its name (any bytes but `/` and NUL).
    pub name: Vec<u8>,
    /// Its inode number (as `stat` reports it).
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
}

/// What `stat` says about a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    /// Inode number (the root's is [`ROOT_INO`]).
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    /// Links: 1 for a file (0 once unlinked while open), 2 plus its
    /// subdirectories for a directory.
    pub nlink: u32,
    /// Size in bytes (a directory reports one block).
    pub size: u64,
    /// Space allocated, in 512-byte units (as `st_blocks`).
    pub blocks: u64,
    /// Last data change, ns since the Unix epoch (atime reads the same: no
    /// access times are kept).
    pub mtime_ns: u64,
    /// Last inode change, ns since the Unix epoch.
    pub ctime_ns: u64,
    /// Tells a file from a later one in the same inode slot (0 for files
    /// made by builds before it was kept, and for directories): with `ino`,
    /// what [`FileSystem::open_ino`] finds a file by.
    pub generation: u64,
}

/// What [`FileSystem::rename_with`] does when the new name is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rename {
    /// Replace it, atomically (`rename`).
    #[default]
    Replace,
    /// Fail with `EEXIST` (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap the two names, atomically; both must exist (`RENAME_EXCHANGE`).
    Exchange,
}

fn lossy(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

fn refused(op: &'static str, path: &[u8], (errno, why): Refusal) -> Error {
    file_error(op, path, errno, why)
}

/// `path` without its trailing slashes (`/` stays `/`).
fn trim_trailing_slashes(path: &[u8]) -> &[u8] {
    let end = path.iter().rposition(|&b| b != b'/').map_or(path.len().min(1), |i| i + 1);
    &path[..end]
}

/// Inode number of a slot.
fn ino(slot: u32) -> u64 {
    if slot == ROOT { ROOT_INO } else { slot as u64 + 2 }
}

fn blocks_512(inode: &Inode) -> u64 {
    inode.extents.iter().map(|e| e.len as u64).sum::<u64>() * (BLOCK_U64 / 512)
}

/// Indexes the names of `inodes` (linked ones: orphans have none), checking
/// the tree: each parent is a directory, no name is taken twice, every
/// directory reaches the root, every hard link names a linked file of its
/// type. An entry that breaks a rule is reported to `problems` and left out.
pub(super) fn index<'a>(inodes: impl Iterator<Item = &'a Named>, problems: &mut dyn Problems) -> Result<Index> {
    let inodes: Vec<&Named> = inodes.collect();
    let dirs: IntSet<u32> = inodes.iter().filter(|n| n.is_dir()).map(|n| n.slot).collect();
    // Sized once: grown as it fills, the tables were rehashed a dozen times
    // each mount (a tenth of mounting a tree of 17,000 names).
    let mut ns = Index::default();
    ns.links.reserve(inodes.iter().map(|n| n.slot as usize + 1).max().unwrap_or(0));
    ns.entries.reserve(dirs.len() + 1);
    // Files first, then the aliases that name them.
    let (aliases, others): (Vec<_>, Vec<_>) = inodes.into_iter().partition(|n| n.alias_of.is_some());
    // The type of each named file, for checking its hard links: only if there are any.
    let mut types: IntMap<u32, u32> = IntMap::default();
    let any_aliases = !aliases.is_empty();
    if any_aliases {
        types.reserve(others.len());
    }
    for inode in others.into_iter().chain(aliases) {
        let (slot, parent) = (inode.slot, inode.parent);
        if parent != ROOT && !dirs.contains(&parent) {
            problems.found(format!(
                "inode {slot} ('{}') names inode {parent} as its directory, which is not one",
                lossy(&inode.name)
            ))?;
            continue;
        }
        let kind = inode.kind();
        let inserted = match inode.alias_of {
            Some(file) if types.get(&file) != Some(&kind) => {
                problems.found(format!(
                    "inode {slot} ('{}') is a hard link to inode {file}, which is not a named file of its type",
                    lossy(&inode.name)
                ))?;
                continue;
            }
            Some(file) => ns.insert_alias(parent, Arc::clone(&inode.name), slot, file),
            None => ns.insert_name(parent, Arc::clone(&inode.name), Child { slot, dir: inode.is_dir() }),
        };
        if !inserted {
            problems.found(format!(
                "two entries of directory {} are named '{}' (inode {slot} is the second)",
                ns.path_of(parent).map_or_else(|| format!("inode {parent}"), |p| format!("'/{}'", lossy(&p))),
                lossy(&inode.name)
            ))?;
        } else if inode.alias_of.is_none() && !inode.is_dir() {
            if any_aliases {
                types.insert(slot, kind);
            }
            if kind == libc::S_IFLNK {
                ns.set_target(slot, inode.target.clone());
            } else if kind == libc::S_IFIFO {
                ns.set_fifo(slot);
            }
        }
    }
    let mut lost = ns.not_reaching_root();
    lost.sort_unstable();
    for slot in lost {
        problems.found(format!("inode {slot} never reaches the root: directories form a loop"))?;
    }
    Ok(ns)
}

impl Meta {
    /// Every file node built so far (linked or orphan): a file whose node
    /// is not built was not used since the mount, so it has nothing in the
    /// cache, nothing dirty and no handle.
    pub(super) fn files(&self) -> impl Iterator<Item = &Arc<Node>> + '_ {
        self.slots.iter().filter_map(|s| match s {
            Slot::File(n) => n.get(),
            _ => None,
        })
    }

    /// Every file node, those not built yet built now: for a listing of
    /// the whole file system, not for a program's calls.
    fn every_file(&self) -> impl Iterator<Item = &Arc<Node>> + '_ {
        (0..self.slots.len() as u32).filter_map(|slot| self.file(slot))
    }

    /// The file node in `slot`, if it holds a file (built now if it was not).
    pub(super) fn file(&self, slot: u32) -> Option<&Arc<Node>> {
        match self.slots.get(slot as usize) {
            Some(Slot::File(lazy)) => Some(lazy.0.get_or_init(|| self.build_node(slot))),
            _ => None,
        }
    }

    /// The node of file `slot` as the mount found it ([`super::LazyNode`]).
    /// Its names are counted now: every change to them (a hard link made or
    /// removed, a rename over one) takes the file's node first.
    fn build_node(&self, slot: u32) -> Arc<Node> {
        // A file whose node is not built has not changed since the mount decoded it
        // (every change to a file takes its node first), nor have its overflow blocks.
        let read_overflow =
            |b: u64| self.overflow.get(&b).cloned().ok_or_else(|| super::format::corrupt("an overflow block unread"));
        let raw = super::check::slot_in(&self.table, slot as u64).expect("a file the mount found has its table block");
        let inode = match Inode::decode(raw, slot as u64, read_overflow, &self.layout) {
            Ok(Some(inode)) => inode,
            other => panic!("inode {slot}, decoded at the mount, does not decode again: {other:?}"),
        };
        let nlink = 1 + self.ns.aliases(slot).len() as u32;
        Node::new(NodeState::fresh(slot, inode, slot as u64 + 1, nlink, 0))
    }

    /// A free inode slot: below the inode mark, searching on from the last
    /// one taken; else the mark's own slot, the mark rising over it in the
    /// running transaction (which puts the superblock in it).
    fn free_slot(&mut self, sb: &super::Superblock) -> Option<u32> {
        let mark = self.inode_mark as usize;
        let below = (0..mark).map(|i| (self.slot_hint + i) % mark).find(|&s| matches!(self.slots[s], Slot::Free));
        let slot = match below {
            Some(slot) => slot,
            None if (mark as u64) < sb.inodes() => {
                debug_assert!(self.slots[mark..].iter().all(|s| matches!(s, Slot::Free)), "a slot in use at the mark");
                self.inode_mark = sb.inode_mark_over(mark as u64);
                self.slots.resize_with(self.inode_mark as usize, || Slot::Free);
                self.dirty.insert(0);
                mark
            }
            None => return None,
        };
        self.slot_hint = slot + 1;
        Some(slot as u32)
    }

    /// Puts directory `slot`'s inode (as changed by `change`) in the running transaction.
    fn change_dir(&mut self, sb: &super::Superblock, slot: u32, change: impl FnOnce(&mut Inode)) -> Result<()> {
        let Slot::Dir(inode) = &mut self.slots[slot as usize] else { unreachable!("slot {slot} holds a directory") };
        change(inode);
        let mut copy = (**inode).clone();
        self.store_inode(sb, slot, &mut copy)
    }

    /// An entry of directory `dir` came or went: its times change.
    fn touch_dir(&mut self, sb: &super::Superblock, dir: u32, now: u64) -> Result<()> {
        if dir == ROOT {
            self.root_times = now;
            return Ok(());
        }
        self.change_dir(sb, dir, |i| {
            i.mtime_ns = now;
            i.ctime_ns = now;
        })
    }

    /// A new inode of type and permission bits `mode`, named `name` in
    /// `parent`, made now: stored, linked, in the running transaction. A
    /// symbolic link (`S_IFLNK`) leads to `target` (empty for anything else).
    fn link_new(
        &mut self,
        sb: &super::Superblock,
        parent: u32,
        name: Vec<u8>,
        (mode, target): (u32, &[u8]),
        op: &'static str,
    ) -> Result<(u32, Inode)> {
        check_name(&name)?;
        let now = now_ns();
        let size = target.len() as u64;
        let target = target.to_vec();
        // The generation tells this file from a later one in the same slot (an open
        // file found again by its inode number: `FileSystem::open_ino`).
        let mut inode =
            Inode { name, mode, mtime_ns: now, ctime_ns: now, size, target, generation: now, ..Inode::default() };
        let count = sb.inodes();
        let Some(slot) = self.free_slot(sb) else {
            return Err(file_error(
                op,
                &inode.name,
                libc::ENOSPC,
                format!("all {count} inodes are in use; remove files or make the file system with more --inodes"),
            ));
        };
        inode.parent = parent;
        self.store_inode(sb, slot, &mut inode)?;
        let inserted = self.ns.insert(parent, &inode.name, Child { slot, dir: inode.is_dir() });
        debug_assert!(inserted, "the caller checked the name is free");
        if inode.is_link() {
            self.ns.set_target(slot, inode.target.clone());
        } else if inode.is_fifo() {
            self.ns.set_fifo(slot);
        }
        self.touch_dir(sb, parent, inode.ctime_ns)?;
        Ok((slot, inode))
    }

    /// Removes the name of file `node` (locked as `state`): it is gone now if no
    /// handle holds it open, else it becomes an orphan its last close frees.
    fn unlink_file(&mut self, fs: &super::Inner, node: &Node, state: &mut NodeState, now: u64) -> Result<()> {
        let (parent, _) = self.ns.link_of(node.slot).cloned().expect("a linked file");
        let drop_now = node.handles.load(Ordering::Acquire) == 0;
        if drop_now {
            // (Before the name goes: a bitmap that cannot be read leaves the file as it was.)
            self.read_bitmap_of(&state.inode)?;
        }
        self.ns.remove_slot(node.slot);
        if drop_now {
            fs.dirty.forget(self.drop_inode(&fs.sb, node.slot, state)?);
        } else {
            state.inode.orphan = true;
            state.inode.ctime_ns = now;
            state.store(fs, self)?;
            state.meta_tid = self.tid;
        }
        self.touch_dir(&fs.sb, parent, now)
    }

    /// Frees directory `slot` (empty, and already unlinked from the index).
    fn drop_dir(&mut self, sb: &super::Superblock, slot: u32) {
        debug_assert!(self.ns.is_empty_dir(slot));
        self.clear_slot(sb, slot);
    }

    /// Removes entry `name` of `parent`, a name of file `node` (locked as
    /// `state`). A hard link's alias is freed; the file's own name, while it
    /// has others, is replaced by one of them (the file keeps its slot, so
    /// its inode number); its last name goes as [`Meta::unlink_file`] says.
    fn unlink_name(
        &mut self,
        fs: &super::Inner,
        (node, state): (&Node, &mut NodeState),
        parent: u32,
        name: &[u8],
        now: u64,
    ) -> Result<()> {
        let holder = self.ns.holder(parent, name).expect("the entry names the file");
        if holder != node.slot {
            self.ns.remove_slot(holder);
            self.clear_slot(&fs.sb, holder);
        } else if let Some(&alias) = self.ns.aliases(node.slot).first() {
            // The file takes over its alias's name, in one transaction with the alias's removal.
            let (alias_parent, alias_name) = self.ns.link_of(alias).cloned().expect("an alias holds a name");
            self.ns.remove_slot(alias);
            self.ns.remove_slot(node.slot);
            self.clear_slot(&fs.sb, alias);
            let inserted = self.ns.insert(alias_parent, &alias_name, Child { slot: node.slot, dir: false });
            debug_assert!(inserted, "the alias's name was just freed");
            state.inode.parent = alias_parent;
            state.inode.name = alias_name.to_vec();
        } else {
            return self.unlink_file(fs, node, state, now);
        }
        state.nlink -= 1;
        debug_assert_eq!(state.nlink as usize, 1 + self.ns.aliases(node.slot).len());
        state.inode.ctime_ns = now;
        state.store(fs, self)?;
        state.meta_tid = self.tid;
        self.touch_dir(&fs.sb, parent, now)
    }

    /// `stat` of a directory slot (or the root).
    fn dir_metadata(&self, slot: u32) -> Metadata {
        let subdirs = self.ns.children(slot).filter(|(_, c)| c.dir).count() as u32;
        let (mode, mtime_ns, ctime_ns) = match self.slots.get(slot as usize) {
            Some(Slot::Dir(i)) => (i.mode, i.mtime_ns, i.ctime_ns),
            _ => (libc::S_IFDIR | 0o755, self.root_times, self.root_times),
        };
        Metadata {
            ino: ino(slot),
            kind: Kind::Dir,
            mode,
            nlink: 2 + subdirs,
            size: BLOCK_U64,
            blocks: BLOCK_U64 / 512,
            mtime_ns,
            ctime_ns,
            generation: 0,
        }
    }
}

/// `stat` of a file, from its state.
fn file_metadata(state: &NodeState) -> Metadata {
    Metadata {
        ino: ino(state.slot),
        kind: match state.inode.mode & libc::S_IFMT {
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            _ => Kind::File,
        },
        mode: state.inode.mode,
        nlink: if state.inode.orphan || !state.live { 0 } else { state.nlink },
        size: state.inode.size,
        blocks: blocks_512(&state.inode),
        mtime_ns: state.mtime_ns(),
        ctime_ns: state.inode.ctime_ns,
        generation: state.inode.generation,
    }
}

/// What a name change needs locked: the file nodes it touches, in slot order.
struct Locked<'a> {
    guards: Vec<(u32, RwLockWriteGuard<'a, NodeState>)>,
}

impl<'a> Locked<'a> {
    fn take(fs: &super::Inner, nodes: &'a [Arc<Node>]) -> Locked<'a> {
        let mut sorted: Vec<&Arc<Node>> = nodes.iter().collect();
        sorted.sort_by_key(|n| n.slot);
        sorted.dedup_by_key(|n| n.slot);
        Locked { guards: sorted.into_iter().map(|n| (n.slot, n.lock_settled(fs))).collect() }
    }

    fn get(&mut self, slot: u32) -> &mut NodeState {
        &mut self.guards.iter_mut().find(|(s, _)| *s == slot).expect("locked").1
    }
}

impl FileSystem {
    fn handle(&self, node: Arc<Node>, direct: bool) -> File {
        node.handles.fetch_add(1, Ordering::AcqRel);
        File { fs: Arc::clone(&self.mount), node, direct }
    }

    /// Creates an empty file (mode `0644`); fails with `EEXIST` if the name is taken.
    pub fn create(&self, path: impl AsRef<[u8]>) -> Result<File> {
        self.create_with_mode(path, 0o644)
    }

    /// Creates an empty file with permission bits `mode` (the caller applies
    /// its umask); `EEXIST` if the name is taken, `ENOENT` if its directory
    /// does not exist.
    pub fn create_with_mode(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<File> {
        let file = self.create_node("create", path.as_ref(), (libc::S_IFREG | (mode & 0o7777), &[]))?;
        Ok(file.expect("a regular file is opened"))
    }

    /// Makes a named pipe (a FIFO) at `path` with permission bits `mode`
    /// (`mkfifo(3)`): a name and an inode that `stat` and `readdir` report
    /// as one. Its bytes pass through a kernel pipe that stands for it
    /// ([`super::lock::fifo_path`], opened by the interposer); this file
    /// system never holds them. `EEXIST` if the name is taken.
    pub fn mkfifo(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<()> {
        let path = path.as_ref();
        self.create_node("mkfifo", path, (libc::S_IFIFO | (mode & 0o7777), &[]))?;
        // A FIFO this slot held before may have left its pipe: the new one starts
        // empty. (If it cannot be removed, the two share it: not worth failing for.)
        if let Some(device) = self.mount.disk.engine().backing() {
            let ino = self.symlink_metadata(path)?.ino;
            let _ = super::lock::forget_fifo(device, ino);
        }
        Ok(())
    }

    /// Makes a symbolic link at `path` that leads to `target` (`symlink(2)`:
    /// any bytes but NUL, at most [`MAX_LINK_TARGET`](super::format::MAX_LINK_TARGET),
    /// kept as they are and resolved when a path goes through the link).
    pub fn symlink(&self, target: impl AsRef<[u8]>, path: impl AsRef<[u8]>) -> Result<()> {
        let (target, path) = (target.as_ref(), path.as_ref());
        if target.is_empty() {
            return Err(file_error("symlink", path, libc::ENOENT, "a symbolic link's target cannot be empty"));
        }
        if target.contains(&0) {
            return Err(file_error("symlink", path, libc::EINVAL, "a symbolic link's target holds no NUL byte"));
        }
        if target.len() > super::format::MAX_LINK_TARGET {
            return Err(file_error(
                "symlink",
                path,
                libc::ENAMETOOLONG,
                format!(
                    "a symbolic link's target is at most {} bytes in an iopath file system (this one is {})",
                    super::format::MAX_LINK_TARGET,
                    target.len()
                ),
            ));
        }
        self.create_node("symlink", path, (libc::S_IFLNK | 0o777, target)).map(drop)
    }

    /// `link(2)`: gives the file (or symbolic link) `existing` names another
    /// name, `new`: a hard link. `existing` is not followed if it is a link
    /// (as Linux's `link`). Both names lead to one file, with one inode
    /// number and `nlink` counting its names, until the last is removed.
    /// `EPERM` for a directory, `EEXIST` if `new` is taken, `EMLINK` past
    /// [`MAX_HARD_LINKS`] names.
    pub fn hard_link(&self, existing: impl AsRef<[u8]>, new: impl AsRef<[u8]>) -> Result<()> {
        let (from, to) = (existing.as_ref(), new.as_ref());
        let fs = &self.mount;
        fs.check_writable("link", to)?;
        // A trailing '/' follows a link there (and then demands a directory).
        let follow = from.ends_with(b"/");
        loop {
            // As Linux checks: the existing name, then the new one, then what the first names.
            let node = {
                let meta = fs.meta();
                let walk = meta.ns.walk(from, follow).map_err(|r| refused("link", from, r))?;
                let Some(found) = walk.found else {
                    return Err(file_error("link", from, libc::ENOENT, "no such file"));
                };
                new_link_name(&meta, to)?;
                if found.dir {
                    return Err(file_error("link", from, libc::EPERM, "a directory cannot have hard links"));
                }
                Arc::clone(meta.file(found.slot).expect("a file's slot holds its node"))
            };
            let mut state = node.lock_settled(fs);
            let mut meta = fs.meta();
            if meta.ns.walk(from, follow).ok().and_then(|w| w.found).map(|c| c.slot) != Some(node.slot) {
                continue; // renamed or replaced meanwhile: look again
            }
            let (parent, name) = new_link_name(&meta, to)?;
            if state.nlink >= MAX_HARD_LINKS {
                let why = format!("a file has at most {MAX_HARD_LINKS} names in an iopath file system");
                return Err(file_error("link", from, libc::EMLINK, why));
            }
            let count = fs.sb.inodes();
            let Some(slot) = meta.free_slot(&fs.sb) else {
                let why = format!("all {count} inodes are in use (a hard link takes one); remove files first");
                return Err(file_error("link", to, libc::ENOSPC, why));
            };
            let now = now_ns();
            let mut alias = Inode::alias(name.clone(), parent, node.slot, state.inode.mode);
            meta.store_inode(&fs.sb, slot, &mut alias)?;
            meta.slots[slot as usize] = Slot::Alias(Box::new(alias));
            let inserted = meta.ns.insert_alias(parent, Name::from(&name[..]), slot, node.slot);
            debug_assert!(inserted, "the name is free");
            state.nlink += 1;
            state.inode.ctime_ns = now;
            state.store(fs, &mut meta)?;
            state.meta_tid = meta.tid;
            meta.touch_dir(&fs.sb, parent, now)?;
            drop(state);
            return fs.namespace_changed(meta);
        }
    }

    /// `readlink`: the target of the symbolic link `path` names (`EINVAL`
    /// if it names something else).
    pub fn read_link(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>> {
        let path = path.as_ref();
        let meta = self.mount.meta();
        let walk = meta.ns.walk(path, false).map_err(|r| refused("readlink", path, r))?;
        match walk.found {
            None => Err(file_error("readlink", path, libc::ENOENT, "no such file or directory")),
            Some(c) => match meta.ns.target(c.slot) {
                Some(t) => Ok(t.to_vec()),
                None => Err(file_error("readlink", path, libc::EINVAL, "it is not a symbolic link")),
            },
        }
    }

    /// Where `path` leads once its symbolic links are followed (the last
    /// component's too if `follow`): inside, or out of the file system
    /// through a link (see [`Resolved`]). `None`: there is no link on the
    /// way to follow, and the path stands as it is (what it names, or why
    /// it names nothing, is the next call's to say).
    pub fn resolve(&self, path: impl AsRef<[u8]>, follow: bool) -> Result<Option<Resolved>> {
        let path = path.as_ref();
        self.mount.meta().ns.resolve(path, follow).map_err(|r| refused("resolve", path, r))
    }

    /// Makes a new file or symbolic link (`mode`'s type) named by `path`;
    /// a file comes back open.
    fn create_node(&self, op: &'static str, path: &[u8], (mode, target): (u32, &[u8])) -> Result<Option<File>> {
        let fs = &self.mount;
        fs.check_writable(op, path)?;
        let mut meta = fs.meta();
        // As Linux's open(O_CREAT | O_EXCL): '.', '..' or '/' last exist;
        // a name with a trailing '/' is EISDIR, whatever it holds.
        let trimmed = trim_trailing_slashes(path);
        let walk = meta.ns.walk(trimmed, false).map_err(|r| refused(op, path, r))?;
        if walk.name.is_some() && trimmed.len() < path.len() {
            // As Linux: open(O_CREAT) says EISDIR; symlink says the name is taken or missing.
            let (errno, why) = match (target.is_empty(), walk.found) {
                (true, _) => (libc::EISDIR, "a path that ends in '/' names a directory"),
                (false, Some(_)) => (libc::EEXIST, "that name exists"),
                (false, None) => (libc::ENOENT, "a symbolic link's name cannot end in '/'"),
            };
            return Err(file_error(op, path, errno, why));
        }
        let Some(name) = walk.name.filter(|_| walk.found.is_none()).map(Cow::into_owned) else {
            return Err(file_error(op, path, libc::EEXIST, "that name exists; open it or unlink it first"));
        };
        let (slot, inode) = meta.link_new(&fs.sb, walk.parent, name, (mode, target), op)?;
        let node = Node::new(NodeState::fresh(slot, inode, fs.new_cache_id(), 1, meta.tid));
        meta.slots[slot as usize] = Slot::File(super::LazyNode::built(Arc::clone(&node)));
        // Counted under the metadata lock, as every open: an unlink sees it.
        let file = (mode & libc::S_IFMT == libc::S_IFREG).then(|| self.handle(node, false));
        fs.namespace_changed(meta)?;
        Ok(file)
    }

    /// Opens an existing file; `ENOENT` if there is none, `EISDIR` for a directory.
    pub fn open(&self, path: impl AsRef<[u8]>) -> Result<File> {
        self.open_cached(path.as_ref(), true)
    }

    /// `open`; `walk_ahead`: the open counts toward a directory walk (see
    /// [`super::Inner::walk_ahead`]), which a direct open does not.
    fn open_cached(&self, path: &[u8], walk_ahead: bool) -> Result<File> {
        let fs = &self.mount;
        let meta = fs.meta();
        let walk = meta.ns.walk(path, true).map_err(|r| refused("open", path, r))?;
        match walk.found {
            None => Err(file_error("open", path, libc::ENOENT, "no such file")),
            Some(c) if c.dir => Err(file_error("open", path, libc::EISDIR, "it is a directory")),
            Some(c) if meta.ns.is_fifo(c.slot) => Err(file_error(
                "open",
                path,
                libc::ENXIO,
                "a FIFO's bytes pass through a kernel pipe: open it through the interposer (`iopath run --mount`)",
            )),
            Some(c) => {
                let node = Arc::clone(meta.file(c.slot).expect("a file's slot holds its node"));
                let file = self.handle(node, false);
                let ahead = match (&walk.name, walk_ahead) {
                    (Some(name), true) => fs.walk_ahead(&meta, walk.parent, name, c.slot),
                    _ => Vec::new(),
                };
                drop(meta);
                fs.load_whole_files(&ahead);
                Ok(file)
            }
        }
    }

    /// Opens the file whose inode number and generation are `ino` and
    /// `generation` (as [`Metadata`] gave them), whatever its name is now:
    /// an open file found again after its process let the file system go
    /// for a while, and the file was renamed meanwhile (as a descriptor
    /// follows its file across a rename). `ENOENT` if that file is gone
    /// (its slot is free or holds another file); `direct` as
    /// [`FileSystem::open_direct`].
    pub fn open_ino(&self, ino: u64, generation: u64, direct: bool) -> Result<File> {
        let fs = &self.mount;
        let gone = || file_error("open", format!("inode {ino}"), libc::ENOENT, "no such file any more");
        let slot = ino.checked_sub(2).and_then(|s| u32::try_from(s).ok());
        // Counted under the metadata lock, as every open (an unlink sees it); looked
        // at under the file's lock once the metadata's is let go: an unlink holds the
        // file's and waits for the metadata's.
        let file = {
            let meta = fs.meta();
            self.handle(Arc::clone(slot.and_then(|s| meta.file(s)).ok_or_else(gone)?), direct)
        };
        {
            let state = file.node.state.read().expect("file lock poisoned");
            let regular = state.inode.mode & libc::S_IFMT == libc::S_IFREG;
            if !state.live || state.inode.orphan || !regular || state.inode.generation != generation {
                return Err(gone()); // (the handle goes: the last one closes an orphan)
            }
        }
        Ok(file)
    }

    /// Opens an existing file for access that bypasses the page cache (like `O_DIRECT`):
    /// every read and write goes to the device; the file's dirty cached pages are
    /// written back first, and a direct write makes the cache forget the file's pages.
    pub fn open_direct(&self, path: impl AsRef<[u8]>) -> Result<File> {
        let mut file = self.open_cached(path.as_ref(), false)?;
        file.direct = true;
        Ok(file)
    }

    /// Opens a file, creating it empty if there is none.
    pub fn open_or_create(&self, path: impl AsRef<[u8]>) -> Result<File> {
        let path = path.as_ref();
        match self.open(path) {
            Err(Error::File { errno: libc::ENOENT, .. }) => match self.create(path) {
                Err(Error::File { errno: libc::EEXIST, .. }) => self.open(path),
                other => other,
            },
            other => other,
        }
    }

    /// Whether the path names a file or directory.
    pub fn exists(&self, path: impl AsRef<[u8]>) -> bool {
        self.mount.meta().ns.walk(path.as_ref(), true).is_ok_and(|w| w.found.is_some())
    }

    /// Makes a directory with permission bits `mode`.
    pub fn mkdir(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<()> {
        let path = path.as_ref();
        let fs = &self.mount;
        fs.check_writable("mkdir", path)?;
        let mut meta = fs.meta();
        // Trailing slashes are allowed on a new directory, and whatever the
        // name holds makes it EEXIST (as Linux, even for a file).
        let walk = meta.ns.walk(trim_trailing_slashes(path), false).map_err(|r| refused("mkdir", path, r))?;
        let Some(name) = walk.name.filter(|_| walk.found.is_none()).map(Cow::into_owned) else {
            return Err(file_error("mkdir", path, libc::EEXIST, "that name exists"));
        };
        let (slot, inode) =
            meta.link_new(&fs.sb, walk.parent, name, (libc::S_IFDIR | (mode & 0o7777), &[]), "mkdir")?;
        meta.slots[slot as usize] = Slot::Dir(Box::new(inode));
        fs.namespace_changed(meta)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let path = path.as_ref();
        let fs = &self.mount;
        fs.check_writable("rmdir", path)?;
        let mut meta = fs.meta();
        let walk = meta.ns.walk(path, false).map_err(|r| refused("rmdir", path, r))?;
        let Some(found) = walk.found else { return Err(file_error("rmdir", path, libc::ENOENT, "no such directory")) };
        if walk.name.is_none() {
            // As Linux: what the last component is decides, before what it names.
            let last = trim_trailing_slashes(path).rsplit(|&b| b == b'/').next().unwrap_or_default();
            let (errno, why) = match last {
                b"." => (libc::EINVAL, "a path ending in '.' cannot be removed"),
                b".." => (libc::ENOTEMPTY, "a path ending in '..' names a directory that holds this one"),
                _ => (libc::EBUSY, "the root cannot be removed"),
            };
            return Err(file_error("rmdir", path, errno, why));
        }
        if !found.dir {
            return Err(file_error("rmdir", path, libc::ENOTDIR, "it is a file; unlink it"));
        }
        if !meta.ns.is_empty_dir(found.slot) {
            return Err(file_error("rmdir", path, libc::ENOTEMPTY, "the directory is not empty"));
        }
        meta.ns.remove_slot(found.slot);
        meta.drop_dir(&fs.sb, found.slot);
        meta.touch_dir(&fs.sb, walk.parent, now_ns())?;
        fs.namespace_changed(meta)
    }

    /// Removes a file's name; its blocks are free once the removal is
    /// committed and its last handle is closed (handles open now keep working).
    pub fn unlink(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let path = path.as_ref();
        let fs = &self.mount;
        fs.check_writable("unlink", path)?;
        loop {
            let node = {
                let meta = fs.meta();
                let walk = meta.ns.walk(path, false).map_err(|r| refused("unlink", path, r))?;
                match walk.found {
                    None => return Err(file_error("unlink", path, libc::ENOENT, "no such file")),
                    Some(c) if c.dir => {
                        return Err(file_error("unlink", path, libc::EISDIR, "it is a directory; use rmdir"));
                    }
                    Some(c) => Arc::clone(meta.file(c.slot).expect("a file's slot holds its node")),
                }
            };
            let mut state = node.lock_settled(fs);
            let mut meta = fs.meta();
            let walk = meta.ns.walk(path, false).ok().filter(|w| w.found.map(|c| c.slot) == Some(node.slot));
            let Some((parent, name)) = walk.and_then(|w| Some((w.parent, w.name?))) else {
                continue; // renamed or replaced meanwhile: look again
            };
            meta.unlink_name(fs, (&node, &mut state), parent, &name, now_ns())?;
            drop(state);
            return fs.namespace_changed(meta);
        }
    }

    /// Renames `from` to `to`, replacing `to` if it exists, atomically.
    pub fn rename(&self, from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> Result<()> {
        self.rename_with(from, to, Rename::Replace)
    }

    /// Renames `from` to `to` as `how` says (`renameat2`'s flags), atomically:
    /// files or directories, within or across directories.
    pub fn rename_with(&self, from: impl AsRef<[u8]>, to: impl AsRef<[u8]>, how: Rename) -> Result<()> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let fs = &self.mount;
        fs.check_writable("rename", from)?;
        loop {
            // Look, unlocked; lock the files it touches; look again under the lock.
            let (plan, nodes) = {
                let meta = fs.meta();
                let plan = plan_rename(&meta, from, to, how)?;
                let touched = plan.iter().flat_map(RenamePlan::touched);
                let nodes: Vec<Arc<Node>> =
                    touched.filter(|c| !c.dir).map(|c| Arc::clone(meta.file(c.slot).expect("file"))).collect();
                (plan, nodes)
            };
            let Some(plan) = plan else { return Ok(()) };
            let mut locked = Locked::take(fs, &nodes);
            let mut meta = fs.meta();
            if plan_rename(&meta, from, to, how)?.as_ref() != Some(&plan) {
                continue;
            }
            apply_rename(fs, &mut meta, &mut locked, &plan, how)?;
            drop(locked);
            return fs.namespace_changed(meta);
        }
    }

    /// The entries of a directory, by name (without `.` and `..`).
    pub fn read_dir(&self, path: impl AsRef<[u8]>) -> Result<Vec<DirEntry>> {
        let path = path.as_ref();
        let meta = self.mount.meta();
        let walk = meta.ns.walk(path, true).map_err(|r| refused("read_dir", path, r))?;
        match walk.found {
            None => Err(file_error("read_dir", path, libc::ENOENT, "no such directory")),
            Some(c) if !c.dir => Err(file_error("read_dir", path, libc::ENOTDIR, "it is a file")),
            Some(c) => Ok(meta
                .ns
                .children(c.slot)
                .map(|(name, child)| DirEntry {
                    name: name.to_vec(),
                    ino: ino(child.slot),
                    kind: if child.dir {
                        Kind::Dir
                    } else if meta.ns.target(child.slot).is_some() {
                        Kind::Symlink
                    } else if meta.ns.is_fifo(child.slot) {
                        Kind::Fifo
                    } else {
                        Kind::File
                    },
                })
                .collect()),
        }
    }

    /// `stat`: what the path names (a symbolic link's target).
    pub fn metadata(&self, path: impl AsRef<[u8]>) -> Result<Metadata> {
        self.metadata_as(path.as_ref(), true)
    }

    /// `lstat`: what the path names, a symbolic link itself where it names one.
    /// (A trailing `/` follows it, as on Linux.)
    pub fn symlink_metadata(&self, path: impl AsRef<[u8]>) -> Result<Metadata> {
        let path = path.as_ref();
        self.metadata_as(path, path.ends_with(b"/"))
    }

    fn metadata_as(&self, path: &[u8], follow: bool) -> Result<Metadata> {
        let meta = self.mount.meta();
        let walk = meta.ns.walk(path, follow).map_err(|r| refused("stat", path, r))?;
        match walk.found {
            None => Err(file_error("stat", path, libc::ENOENT, "no such file or directory")),
            Some(c) if c.dir => Ok(meta.dir_metadata(c.slot)),
            Some(c) => {
                let node = Arc::clone(meta.file(c.slot).expect("file"));
                drop(meta);
                let state = node.state.read().expect("file lock poisoned");
                Ok(file_metadata(&state))
            }
        }
    }

    /// `chmod`: sets the permission bits (the low 12 bits of `mode`).
    pub fn set_mode(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<()> {
        self.change_inode(path.as_ref(), "chmod", true, |i| i.mode = (i.mode & libc::S_IFMT) | (mode & 0o7777))
    }

    /// `utimes`: sets the modification time (ns since the Unix epoch).
    pub fn set_mtime(&self, path: impl AsRef<[u8]>, mtime_ns: u64) -> Result<()> {
        self.change_inode(path.as_ref(), "utimes", true, |i| i.mtime_ns = mtime_ns)
    }

    /// `utimensat(AT_SYMLINK_NOFOLLOW)`: as [`FileSystem::set_mtime`], on a
    /// symbolic link itself where the path names one.
    pub fn set_symlink_mtime(&self, path: impl AsRef<[u8]>, mtime_ns: u64) -> Result<()> {
        self.change_inode(path.as_ref(), "utimes", false, |i| i.mtime_ns = mtime_ns)
    }

    fn change_inode(&self, path: &[u8], op: &'static str, follow: bool, change: impl FnOnce(&mut Inode)) -> Result<()> {
        let fs = &self.mount;
        fs.check_writable(op, path)?;
        let found = fs.meta().ns.walk(path, follow).map_err(|r| refused(op, path, r))?.found;
        match found {
            None => Err(file_error(op, path, libc::ENOENT, "no such file or directory")),
            Some(c) if c.slot == ROOT => {
                Err(file_error(op, path, libc::EPERM, "the root of an iopath file system keeps its mode and times"))
            }
            Some(c) if c.dir => {
                let mut meta = fs.meta();
                if !matches!(meta.slots[c.slot as usize], Slot::Dir(_)) {
                    return Err(file_error(op, path, libc::ENOENT, "removed meanwhile"));
                }
                let now = now_ns();
                meta.change_dir(&fs.sb, c.slot, |i| {
                    change(i);
                    i.ctime_ns = now;
                })
            }
            Some(c) => {
                // Counted under the metadata lock, as every open: an unlink sees it.
                let file = fs.meta().file(c.slot).map(|node| self.handle(Arc::clone(node), false));
                let Some(file) = file else { return Err(file_error(op, path, libc::ENOENT, "removed meanwhile")) };
                file.change_inode(op, change)
            }
        }
    }

    /// Every file (not directory), by path from the root, sorted.
    pub fn list(&self) -> Vec<super::Entry> {
        let meta = self.mount.meta();
        let files: Vec<(Vec<u8>, Arc<Node>)> =
            meta.every_file().filter_map(|n| Some((meta.ns.path_of(n.slot)?, Arc::clone(n)))).collect();
        drop(meta);
        let mut out: Vec<super::Entry> = files
            .into_iter()
            .filter_map(|(path, n)| {
                let s = n.state.read().expect("file lock poisoned");
                s.live.then(|| super::Entry { name: lossy(&path), size: s.inode.size })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Names in the namespace (files and directories, not the root).
    pub fn names(&self) -> usize {
        self.mount.meta().ns.len()
    }
}

impl File {
    /// The file's path from the root now (lossy UTF-8); an unlinked file's
    /// last name with ` (deleted)`, as `/proc` shows it.
    pub fn name(&self) -> String {
        let path = self.fs.meta().ns.path_of(self.node.slot);
        match path {
            Some(p) => lossy(&p),
            None => format!("{} (deleted)", lossy(&self.node.state.read().expect("file lock poisoned").inode.name)),
        }
    }

    /// The file's path from the root now (`/dir/name`), or `None` once its
    /// last name is gone (unlinked while open).
    pub fn path(&self) -> Option<Vec<u8>> {
        let inner = self.fs.meta().ns.path_of(self.node.slot)?;
        let mut path = Vec::with_capacity(inner.len() + 1);
        path.push(b'/');
        path.extend_from_slice(&inner);
        Some(path)
    }

    /// `fstat`.
    pub fn metadata(&self) -> Metadata {
        file_metadata(&self.node.state.read().expect("file lock poisoned"))
    }

    /// `fchmod`: sets the permission bits (the low 12 bits of `mode`).
    pub fn set_mode(&self, mode: u32) -> Result<()> {
        self.change_inode("chmod", |i| i.mode = (i.mode & libc::S_IFMT) | (mode & 0o7777))
    }

    /// `futimens`: sets the modification time (ns since the Unix epoch).
    pub fn set_mtime(&self, mtime_ns: u64) -> Result<()> {
        self.change_inode("utimes", |i| i.mtime_ns = mtime_ns)
    }

    fn change_inode(&self, op: &'static str, change: impl FnOnce(&mut Inode)) -> Result<()> {
        let fs = &self.fs;
        let mut state = self.node.lock_settled(fs);
        fs.check_writable(op, &state.inode.name)?;
        if !state.live {
            return Err(file_error(op, &state.inode.name, libc::ESTALE, "the file is gone"));
        }
        // A direct overwrite's time first, so that a time `change` sets replaces it.
        let mtime = state.mtime_ns();
        state.set_mtime(mtime);
        change(&mut state.inode);
        state.inode.ctime_ns = now_ns();
        let mut meta = fs.meta();
        state.store(fs, &mut meta)?;
        state.meta_tid = meta.tid;
        Ok(())
    }

    /// The last handle closed: gives back the space appends took ahead, and
    /// frees an orphan.
    pub(super) fn last_close(&self) {
        self.trim_ahead();
        let fs = &self.fs;
        let Ok(mut state) = self.node.state.write() else { return };
        state.settle(fs, true);
        if !state.live || !state.inode.orphan || fs.check_writable("close", &state.inode.name).is_err() {
            return;
        }
        let mut meta = fs.meta();
        if self.node.handles.load(Ordering::Acquire) == 0 {
            // A bitmap that cannot be read keeps the orphan: the next mount frees it.
            if let Ok(dropped) = meta.drop_inode(&fs.sb, self.node.slot, &mut state) {
                fs.dirty.forget(dropped);
            }
        }
    }
}

/// A rename, resolved: what moves where, and what it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RenamePlan {
    src: Child,
    from_parent: u32,
    from_name: Vec<u8>,
    to_parent: u32,
    to_name: Vec<u8>,
    /// What `to` names now (replaced, or swapped with an exchange).
    dst: Option<Child>,
}

impl RenamePlan {
    fn touched(&self) -> impl Iterator<Item = Child> + '_ {
        std::iter::once(self.src).chain(self.dst)
    }
}

/// Resolves and checks a rename, in the order Linux's `renameat2` checks
/// (so a call that is wrong in several ways gets the errno it gets there);
/// `None` when there is nothing to do (both names lead to the same inode).
fn plan_rename(meta: &Meta, from: &[u8], to: &[u8], how: Rename) -> Result<Option<RenamePlan>> {
    let (from_dir, to_dir) = (from.ends_with(b"/"), to.ends_with(b"/"));
    let src = meta.ns.walk(trim_trailing_slashes(from), false).map_err(|r| refused("rename", from, r))?;
    let dst = meta.ns.walk(trim_trailing_slashes(to), false).map_err(|r| refused("rename", to, r))?;
    let Some(from_name) = src.name.map(Cow::into_owned) else {
        return Err(file_error("rename", from, libc::EBUSY, "'/', '.' and '..' cannot be renamed"));
    };
    let Some(to_name) = dst.name.map(Cow::into_owned) else {
        let errno = if how == Rename::NoReplace { libc::EEXIST } else { libc::EBUSY };
        return Err(file_error("rename", to, errno, "'/', '.' and '..' cannot be replaced"));
    };
    let Some(s) = src.found else { return Err(file_error("rename", from, libc::ENOENT, "no such file or directory")) };
    match (how, dst.found) {
        (Rename::NoReplace, Some(_)) => return Err(file_error("rename", to, libc::EEXIST, "that name exists")),
        (Rename::Exchange, None) => return Err(file_error("rename", to, libc::ENOENT, "nothing to exchange with")),
        (Rename::Exchange, Some(d)) if !d.dir && to_dir => {
            return Err(file_error("rename", to, libc::ENOTDIR, "a path that ends in '/' names a directory"));
        }
        _ => {}
    }
    if !s.dir && (from_dir || (to_dir && how != Rename::Exchange)) {
        return Err(file_error("rename", from, libc::ENOTDIR, "a path that ends in '/' names a directory"));
    }
    // Neither may move below itself.
    if s.dir && dst.parent != src.parent && meta.ns.is_within(dst.parent, s.slot) {
        return Err(file_error("rename", to, libc::EINVAL, "a directory cannot move into itself"));
    }
    if dst.found.is_some_and(|d| d.dir && dst.parent != src.parent && meta.ns.is_within(src.parent, d.slot)) {
        let errno = if how == Rename::Exchange { libc::EINVAL } else { libc::ENOTEMPTY };
        return Err(file_error("rename", to, errno, "it would replace a directory the source lies in"));
    }
    if dst.found == Some(s) {
        return Ok(None);
    }
    match (how, dst.found) {
        (Rename::Exchange, _) | (_, None) => {}
        (_, Some(d)) if s.dir && !d.dir => {
            return Err(file_error("rename", to, libc::ENOTDIR, "a directory cannot replace a file"));
        }
        (_, Some(d)) if !s.dir && d.dir => {
            return Err(file_error("rename", to, libc::EISDIR, "a file cannot replace a directory"));
        }
        (_, Some(d)) if d.dir && !meta.ns.is_empty_dir(d.slot) => {
            return Err(file_error("rename", to, libc::ENOTEMPTY, "the directory it would replace is not empty"));
        }
        _ => {}
    }
    Ok(Some(RenamePlan { src: s, from_parent: src.parent, from_name, to_parent: dst.parent, to_name, dst: dst.found }))
}

/// Where `link(2)` would make the new name `to`: its directory and name, or
/// the errno Linux gives (a name that ends in `/` is taken, EEXIST, or
/// cannot be made, ENOENT; `.`, `..` and `/` exist).
fn new_link_name(meta: &Meta, to: &[u8]) -> Result<(u32, Vec<u8>)> {
    let trimmed = trim_trailing_slashes(to);
    let walk = meta.ns.walk(trimmed, false).map_err(|r| refused("link", to, r))?;
    if walk.name.is_some() && walk.found.is_none() && trimmed.len() < to.len() {
        return Err(file_error("link", to, libc::ENOENT, "a new name cannot end in '/'"));
    }
    match walk.name.filter(|_| walk.found.is_none()) {
        Some(name) => {
            check_name(&name)?;
            Ok((walk.parent, name.into_owned()))
        }
        None => Err(file_error("link", to, libc::EEXIST, "that name exists")),
    }
}

/// Gives the name `name` in `parent` to inode `holder`, which held a name
/// of `child` (itself, or a hard link's alias), in memory and in the
/// running transaction.
fn rename_inode(
    fs: &super::Inner,
    meta: &mut Meta,
    locked: &mut Locked<'_>,
    (child, holder): (Child, u32),
    parent: u32,
    name: &[u8],
    now: u64,
) -> Result<()> {
    if holder != child.slot {
        let inserted = meta.ns.insert_alias(parent, Name::from(name), holder, child.slot);
        debug_assert!(inserted, "the new name is free");
        let Slot::Alias(alias) = &mut meta.slots[holder as usize] else { unreachable!("slot {holder} is an alias") };
        alias.parent = parent;
        alias.name = name.to_vec();
        let mut copy = (**alias).clone();
        meta.store_inode(&fs.sb, holder, &mut copy)?;
        // The file's inode changed as POSIX sees it (one inode, many names): its ctime.
        let state = locked.get(child.slot);
        state.inode.ctime_ns = now;
        state.store(fs, meta)?;
        state.meta_tid = meta.tid;
        return Ok(());
    }
    let inserted = meta.ns.insert(parent, name, child);
    debug_assert!(inserted, "the new name is free");
    if child.dir {
        return meta.change_dir(&fs.sb, child.slot, |i| {
            i.parent = parent;
            i.name = name.to_vec();
            i.ctime_ns = now;
        });
    }
    let state = locked.get(child.slot);
    state.inode.parent = parent;
    state.inode.name = name.to_vec();
    state.inode.ctime_ns = now;
    state.store(fs, meta)?;
    state.meta_tid = meta.tid;
    Ok(())
}

fn apply_rename(
    fs: &super::Inner,
    meta: &mut Meta,
    locked: &mut Locked<'_>,
    plan: &RenamePlan,
    how: Rename,
) -> Result<()> {
    let now = now_ns();
    // The inodes that hold the two names: the files' own, or hard links' aliases.
    let holder = |meta: &Meta, parent: u32, name: &[u8]| meta.ns.holder(parent, name).expect("the entry exists");
    let src_holder = holder(meta, plan.from_parent, &plan.from_name);
    meta.ns.remove_slot(src_holder);
    match (how, plan.dst) {
        (Rename::Exchange, Some(d)) => {
            let dst_holder = holder(meta, plan.to_parent, &plan.to_name);
            meta.ns.remove_slot(dst_holder);
            rename_inode(fs, meta, locked, (d, dst_holder), plan.from_parent, &plan.from_name, now)?;
        }
        (_, Some(d)) if d.dir => {
            meta.ns.remove_slot(d.slot);
            meta.drop_dir(&fs.sb, d.slot);
        }
        (_, Some(d)) => {
            let node = Arc::clone(meta.file(d.slot).expect("file"));
            meta.unlink_name(fs, (&node, locked.get(d.slot)), plan.to_parent, &plan.to_name, now)?;
        }
        (_, None) => {}
    }
    rename_inode(fs, meta, locked, (plan.src, src_holder), plan.to_parent, &plan.to_name, now)?;
    meta.touch_dir(&fs.sb, plan.from_parent, now)?;
    if plan.to_parent != plan.from_parent {
        meta.touch_dir(&fs.sb, plan.to_parent, now)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(entries: &[(u32, &str, u32, bool)]) -> Index {
        let mut ix = Index::default();
        for &(parent, name, slot, dir) in entries {
            assert!(ix.insert(parent, name.as_bytes(), Child { slot, dir }));
        }
        ix
    }

    #[test]
    fn a_table_by_slot_keeps_what_a_map_would() {
        let mut t = BySlot::default();
        assert_eq!((t.insert(7, "seven"), t.insert(2, "two"), t.insert(7, "SEVEN")), (None, None, Some("seven")));
        assert_eq!((t.len(), t.get(&7), t.get(&3), t.get(&ROOT)), (2, Some(&"SEVEN"), None, None));
        assert_eq!(t.keys().collect::<Vec<_>>(), [2, 7]);
        assert_eq!((t.remove(&2), t.remove(&2), t.remove(&99), t.len()), (Some("two"), None, None, 1));
        assert_eq!(t.keys().collect::<Vec<_>>(), [7]);
    }

    #[test]
    fn a_hard_link_names_a_named_file_of_its_type_or_is_reported() {
        let file = |name: &str, mode: u32| Inode { name: name.as_bytes().to_vec(), mode, ..Inode::default() };
        let alias = |name: &str, file: u32, mode: u32| Inode::alias(name.as_bytes().to_vec(), ROOT, file, mode);
        let inodes = [
            (0, file("f", libc::S_IFREG | 0o644)),
            (1, alias("g", 0, libc::S_IFREG)),
            (2, alias("h", 0, libc::S_IFLNK)),
            (3, alias("i", 1, libc::S_IFREG)),
            (4, alias("j", 9, libc::S_IFREG)),
            (5, alias("f", 0, libc::S_IFREG)),
            (6, alias("k", 0, libc::S_IFREG)),
        ];
        let mut problems = super::super::check::AllProblems::default();
        let named: Vec<Named> = inodes.into_iter().map(|(slot, mut inode)| Named::take(slot, &mut inode)).collect();
        let ns = super::index(named.iter(), &mut problems).unwrap();
        // Of another type, of an alias, of nothing, and a name taken: four problems.
        assert_eq!(problems.0.len(), 4, "{:?}", problems.0);
        assert!(problems.0[0].contains("inode 2 ('h') is a hard link to inode 0"), "{:?}", problems.0);
        assert_eq!(ns.aliases(0), &[1, 6]);
        assert_eq!(ns.get(ROOT, b"g"), Some(Child { slot: 0, dir: false }));
        assert_eq!((ns.holder(ROOT, b"g"), ns.holder(ROOT, b"f"), ns.holder(ROOT, b"x")), (Some(1), Some(0), None));
        let mut ns = ns;
        ns.remove_slot(1);
        assert_eq!((ns.aliases(0), ns.get(ROOT, b"g"), ns.len()), (&[6][..], None, 2));
    }

    #[test]
    fn paths_resolve_with_dots_slashes_and_the_errno_posix_gives() {
        // /a (dir 0), /a/b (dir 1), /a/b/f (file 2), /g (file 3)
        let ix = index(&[(ROOT, "a", 0, true), (0, "b", 1, true), (1, "f", 2, false), (ROOT, "g", 3, false)]);
        let found = |p: &str| ix.walk(p.as_bytes(), true).map(|w| w.found.map(|c| c.slot));
        assert_eq!(found("a/b/f"), Ok(Some(2)));
        assert_eq!(found("/a//b/./f"), Ok(Some(2)));
        assert_eq!(found("a/b/../b/f"), Ok(Some(2)));
        assert_eq!(found("../../a"), Ok(Some(0)), "the root's parent is the root");
        assert_eq!(found("/"), Ok(Some(ROOT)));
        assert_eq!(found("a/b/.."), Ok(Some(0)));
        assert_eq!(found("a/new"), Ok(None));
        let errno = |p: &[u8]| ix.walk(p, true).unwrap_err().0;
        assert_eq!(errno(b""), libc::ENOENT);
        assert_eq!(errno(b"nope/f"), libc::ENOENT);
        assert_eq!(errno(b"g/x"), libc::ENOTDIR);
        assert_eq!(errno(b"g/"), libc::ENOTDIR);
        assert_eq!(errno(b"g/.."), libc::ENOTDIR);
        assert_eq!(errno(&[b'n'; 256]), libc::ENAMETOOLONG);
        assert_eq!(errno(&[b'a'; MAX_PATH + 1]), libc::ENAMETOOLONG);
        let w = ix.walk(b"a/b/", true).unwrap();
        assert!(w.name.as_deref() == Some(&b"b"[..]) && w.parent == 0);
        let dot = ix.walk(b"a/.", true).unwrap();
        assert_eq!((dot.name, dot.found.map(|c| c.slot), dot.parent), (None, Some(0), ROOT));
    }

    #[test]
    fn a_loop_of_directories_is_found_whatever_hangs_below_it() {
        // /a (dir 0) with file 4; dirs 1 and 2 name each other as parent, file 3 in 2.
        let ix = index(&[
            (ROOT, "a", 0, true),
            (0, "f", 4, false),
            (2, "b", 1, true),
            (1, "c", 2, true),
            (2, "g", 3, false),
        ]);
        let mut lost = ix.not_reaching_root();
        lost.sort_unstable();
        assert_eq!(lost, [1, 2, 3]);
        assert!(index(&[(ROOT, "a", 0, true), (0, "b", 1, true)]).not_reaching_root().is_empty());
    }

    #[test]
    fn paths_ancestry_and_removal_follow_the_links() {
        let mut ix = index(&[(ROOT, "a", 0, true), (0, "b", 1, true), (1, "f", 2, false)]);
        assert_eq!(ix.path_of(2).unwrap(), b"a/b/f");
        assert_eq!(ix.path_of(ROOT).unwrap(), b"");
        assert!(ix.is_within(1, 0) && ix.is_within(0, 0) && ix.is_within(0, ROOT) && !ix.is_within(0, 1));
        assert!(!ix.is_empty_dir(1));
        assert!(!ix.insert(1, b"f", Child { slot: 9, dir: false }), "a taken name");
        ix.remove_slot(2);
        assert!(ix.is_empty_dir(1) && ix.path_of(2).is_none() && ix.get(1, b"f").is_none());
        let names: Vec<&[u8]> = ix.children(ROOT).map(|(n, _)| n).collect();
        assert_eq!(names, vec![&b"a"[..]]);
    }
}
