//! Pod networks for many node agents on one machine: a slot is a bridge name and a pod CIDR no
//! other holder of a slot uses.
//!
//! Bridge names are global in the host's network namespace, and two bridges with the same
//! subnet break the host's routing, so node agents that share a machine (the test suite runs
//! many servers at once, each in a temporary directory) must not pick the same ones. Slot `n`
//! (0 to [`MAX_SLOT`]) is held by an exclusive `flock` on `<lock dir>/slot-<n>.lock` and gives:
//!
//! | slot | bridge     | pod CIDR          |
//! |------|------------|-------------------|
//! | `n`  | `kvrs<n>`  | `10.245.<n>.0/24` |
//!
//! `10.245.0.0/16` is kept apart from the fixed `10.244.0.0/24` a single server uses by default
//! and from the `10.244.x.0/24` networks this crate's own tests pick.
//!
//! # Guarantees
//! - Two live [`PodNetworkSlot`]s never share a slot, within a process or across processes
//!   (each acquisition opens the lock file anew, and `flock` locks conflict between open file
//!   descriptions).
//! - The lock goes with the holder: dropping the slot or the process ending in any way (also
//!   `kill -9`) frees it, so nothing leaks.
//! - A slot is handed over clean: a bridge left behind by a holder that was killed is deleted
//!   on acquisition (detaching the dead holder's veths, whose addresses the new holder's
//!   `host-local` would hand out again); the `bridge` plugin creates it anew on the next ADD.
//! - Except for its own owner: [`PodNetworkSlot::acquire_for`] names the holder in the lock
//!   file, and a holder that comes back (a server restarted on the same data directory, whose
//!   pods kept running) takes its slot again with the bridge as it was, when no one else took
//!   the slot in between. Until then its slot is kept for it: a free slot that names an owner
//!   and still has its bridge is taken only when no other slot is free, so a server killed
//!   and started again does not find its pods' network reset and their addresses handed out
//!   by someone else.
//!
//! # Caveats
//! Masquerade and hostPort rules a killed holder's pods left in iptables stay until the host
//! reboots; they match only those pods' addresses and ports. Pod networks made without a slot
//! (fixed names) are not seen by the allocator.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::{CniNetwork, HostError, Ipv4Cidr};

/// The lock directory every node agent of the machine uses unless told otherwise (root only,
/// like the bridges themselves).
pub const DEFAULT_LOCK_DIR: &str = "/run/kubevirt-rs/pod-network-slots";

/// The highest slot number: slots are `0..=MAX_SLOT`.
pub const MAX_SLOT: u8 = 250;

/// Why no slot was acquired.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The lock directory could not be created.
    #[error("cannot create the slot lock directory {}", dir.display())]
    LockDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A lock file could not be opened or locked.
    #[error("cannot lock {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Every slot is held.
    #[error("all {} pod network slots under {} are taken", u16::from(MAX_SLOT) + 1, dir.display())]
    Exhausted {
        /// The lock directory.
        dir: PathBuf,
    },
    /// The bridge a killed holder left could not be deleted.
    #[error("cannot reset the bridge of pod network slot {slot}")]
    Reset {
        /// The slot.
        slot: u8,
        /// Why.
        #[source]
        source: HostError,
    },
}

/// A held slot: its bridge and pod CIDR are this holder's until it is dropped.
#[derive(Debug)]
pub struct PodNetworkSlot {
    index: u8,
    /// Holds the `flock`; its content is the owner's name.
    lock: File,
}

impl PodNetworkSlot {
    /// Takes the first free slot under `lock_dir` (created if needed), without waiting, and
    /// deletes a bridge a previous holder of it left behind.
    ///
    /// Every node agent of a machine must use the same `lock_dir` ([`DEFAULT_LOCK_DIR`] unless
    /// all of them agree on another): holders under different directories do not see each other.
    pub fn acquire(lock_dir: &Path) -> Result<Self, SlotError> {
        Self::acquire_with(lock_dir, None, crate::delete_bridge, bridge_present)
    }

    /// As [`Self::acquire`], for a node agent that outlives its process (a server restarted on
    /// the same data directory, its pods still running): the slot this `owner` held last is
    /// taken again when free, and its bridge is then kept as it is, with the running pods'
    /// veths on it. Otherwise the first free slot is taken, reset, and marked as `owner`'s (the
    /// lock file holds the owner's name).
    pub fn acquire_for(lock_dir: &Path, owner: &str) -> Result<Self, SlotError> {
        Self::acquire_with(lock_dir, Some(owner), crate::delete_bridge, bridge_present)
    }

    /// The acquisition, with the reset of a left-behind bridge and the look for one given
    /// (unit tests leave real bridges alone).
    fn acquire_with(
        lock_dir: &Path,
        owner: Option<&str>,
        reset: impl Fn(&str) -> Result<bool, HostError>,
        bridge_present: impl Fn(&str) -> bool,
    ) -> Result<Self, SlotError> {
        std::fs::create_dir_all(lock_dir).map_err(|source| SlotError::LockDir {
            dir: lock_dir.to_path_buf(),
            source,
        })?;
        if let Some(owner) = owner {
            for index in 0..=MAX_SLOT {
                let path = slot_path(lock_dir, index);
                if std::fs::read(&path).is_ok_and(|named| named == owner.as_bytes())
                    && let Some(slot) = Self::try_take(&path, index)?
                {
                    tracing::debug!(slot = index, bridge = %slot.bridge(), "took this owner's pod network slot again");
                    return Ok(slot);
                }
            }
        }
        // A free slot that names an owner and still has its bridge belongs to a node agent that
        // may come back with its pods running on that bridge (a server killed and started
        // again): taking it would reset their network under them and hand their addresses out
        // twice. Such slots are taken only when no other is free.
        let reserved = |index| {
            std::fs::read(slot_path(lock_dir, index)).is_ok_and(|name| !name.is_empty())
                && bridge_present(&bridge_name(index))
        };
        let unreserved_first = (0..=MAX_SLOT)
            .filter(|i| !reserved(*i))
            .chain((0..=MAX_SLOT).filter(|i| reserved(*i)));
        for index in unreserved_first {
            let path = slot_path(lock_dir, index);
            let Some(mut slot) = Self::try_take(&path, index)? else {
                continue;
            };
            if reset(&slot.bridge()).map_err(|source| SlotError::Reset {
                slot: index,
                source,
            })? {
                tracing::info!(slot = index, bridge = %slot.bridge(), "reset the bridge a previous holder left");
            }
            // Anonymous holders clear the name, so no owner takes a slot it did not reset.
            slot.mark(owner.unwrap_or_default())
                .map_err(|source| SlotError::Lock { path, source })?;
            tracing::debug!(slot = index, bridge = %slot.bridge(), subnet = %slot.subnet(), "acquired a pod network slot");
            return Ok(slot);
        }
        Err(SlotError::Exhausted {
            dir: lock_dir.to_path_buf(),
        })
    }

    /// Locks slot `index` unless someone holds it.
    fn try_take(path: &Path, index: u8) -> Result<Option<Self>, SlotError> {
        let lock_error = |source| SlotError::Lock {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(lock_error)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { index, lock: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(source)) => Err(lock_error(source)),
        }
    }

    /// Writes the holder's name into the (locked) lock file.
    fn mark(&mut self, owner: &str) -> io::Result<()> {
        use std::io::{Seek, Write};
        self.lock.set_len(0)?;
        self.lock.rewind()?;
        self.lock.write_all(owner.as_bytes())
    }

    /// The slot number.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The slot's bridge, `kvrs<n>`.
    pub fn bridge(&self) -> String {
        bridge_name(self.index)
    }

    /// The slot's pod CIDR, `10.245.<n>.0/24`.
    pub fn subnet(&self) -> Ipv4Cidr {
        slot_subnet(self.index)
    }

    /// A network on the slot's bridge and CIDR, with [`CniNetwork::new`]'s defaults.
    pub fn network(&self, name: impl Into<String>) -> CniNetwork {
        CniNetwork::new(name, self.bridge(), self.subnet())
    }
}

fn bridge_present(bridge: &str) -> bool {
    Path::new("/sys/class/net").join(bridge).exists()
}

fn slot_path(lock_dir: &Path, index: u8) -> PathBuf {
    lock_dir.join(format!("slot-{index}.lock"))
}

fn bridge_name(index: u8) -> String {
    format!("kvrs{index}")
}

fn slot_subnet(index: u8) -> Ipv4Cidr {
    Ipv4Cidr::slash_24(Ipv4Addr::new(10, 245, index, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_distinct_bridges_and_cidrs_in_10_245() {
        assert_eq!(bridge_name(0), "kvrs0");
        assert_eq!(bridge_name(MAX_SLOT), "kvrs250");
        assert!(bridge_name(MAX_SLOT).len() <= 15);
        assert_eq!(slot_subnet(7).to_string(), "10.245.7.0/24");
        assert_eq!(slot_subnet(MAX_SLOT).to_string(), "10.245.250.0/24");
    }

    /// Acquires in a private directory: slot numbers are then predictable, and the bridges of
    /// real holders (`kvrs0` …) must not be reset.
    fn acquire(dir: &Path) -> Result<PodNetworkSlot, SlotError> {
        PodNetworkSlot::acquire_with(dir, None, |_| Ok(false), |_| false)
    }

    #[test]
    fn held_slots_are_distinct_and_a_dropped_slot_is_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = acquire(dir.path()).unwrap();
        let b = acquire(dir.path()).unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_ne!(a.subnet(), b.subnet());
        drop(a);
        let c = acquire(dir.path()).unwrap();
        assert_eq!(c.index(), 0);
        assert_eq!(c.network("pods").bridge, "kvrs0");
    }

    #[test]
    fn the_bridge_a_previous_holder_left_is_reset_on_acquisition() {
        let dir = tempfile::tempdir().unwrap();
        let reset = std::cell::RefCell::new(Vec::new());
        let slot = PodNetworkSlot::acquire_with(
            dir.path(),
            None,
            |bridge| {
                reset.borrow_mut().push(bridge.to_owned());
                Ok(true)
            },
            |_| true,
        )
        .unwrap();
        assert_eq!(*reset.borrow(), vec![slot.bridge()]);
    }

    #[test]
    fn an_owner_takes_its_slot_again_without_a_reset_and_others_get_theirs_reset() {
        let dir = tempfile::tempdir().unwrap();
        let resets = std::cell::RefCell::new(Vec::new());
        let take = |owner| {
            PodNetworkSlot::acquire_with(
                dir.path(),
                owner,
                |bridge: &str| {
                    resets.borrow_mut().push(bridge.to_owned());
                    Ok(false)
                },
                |_| false,
            )
            .unwrap()
        };
        let first = take(None);
        let server = take(Some("/srv/a"));
        assert_eq!((first.index(), server.index()), (0, 1));
        drop(first);
        drop(server);
        resets.borrow_mut().clear();
        // The server restarts: slot 1 again, its bridge (and pods) left alone.
        let again = take(Some("/srv/a"));
        assert_eq!(again.index(), 1);
        assert!(resets.borrow().is_empty(), "{:?}", resets.borrow());
        // Another server gets a free slot, reset, and the anonymous holder's name is not an owner.
        let other = take(Some("/srv/b"));
        assert_eq!(other.index(), 0);
        assert_eq!(*resets.borrow(), vec!["kvrs0".to_owned()]);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("slot-0.lock")).unwrap(),
            "/srv/b"
        );
    }

    #[test]
    fn a_free_slot_naming_an_owner_with_its_bridge_is_kept_for_it_while_others_are_free() {
        let dir = tempfile::tempdir().unwrap();
        let take = |owner| {
            PodNetworkSlot::acquire_with(dir.path(), owner, |_: &str| Ok(false), |_| true).unwrap()
        };
        // Server a is killed (its slot is free, its pods still run on the bridge).
        drop(take(Some("/srv/a")));
        // Others, named or not, get other slots meanwhile.
        let b = take(Some("/srv/b"));
        let anonymous = take(None);
        assert_eq!((b.index(), anonymous.index()), (1, 2));
        // a comes back to its own slot.
        assert_eq!(take(Some("/srv/a")).index(), 0);
    }

    #[test]
    fn a_slot_held_by_another_process_is_skipped_and_freed_when_it_dies() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("slot-0.lock");
        std::fs::write(&lock, b"").unwrap();
        // A shell takes the lock on its descriptor 9 with flock(1), then becomes `sleep`, which
        // keeps the descriptor (and the lock) until we kill it.
        let mut holder = std::process::Command::new("sh")
            .arg("-c")
            .arg("exec 9>\"$0\" && flock -x 9 && exec sleep 600")
            .arg(&lock)
            .spawn()
            .unwrap();
        let guard = KillOnDrop(&mut holder);
        let held = wait_for_lock_held(&lock);
        assert!(held, "flock did not take the lock");
        let slot = acquire(dir.path()).unwrap();
        assert_eq!(slot.index(), 1);
        drop(slot);
        drop(guard);
        let slot = acquire(dir.path()).unwrap();
        assert_eq!(slot.index(), 0, "a killed holder's slot is free again");
    }

    struct KillOnDrop<'a>(&'a mut std::process::Child);

    impl Drop for KillOnDrop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Polls until another process holds `lock` (our own try_lock fails).
    fn wait_for_lock_held(lock: &Path) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            let file = File::options().write(true).open(lock).unwrap();
            match file.try_lock() {
                Err(TryLockError::WouldBlock) => return true,
                _ => drop(file),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }
}
