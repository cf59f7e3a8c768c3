//! Guest memory: size, hotplug room (`maxGuest`) and huge-page backing.
//!
//! Sizes are rendered in MiB, so both must be whole MiB. When `maxGuest` is above
//! `guest`, `slots`/`maxmem` leave room for DIMMs added later. Huge pages come from a
//! `memory-backend-file` on the hugetlbfs mount, which the machine then uses as its RAM
//! (`-machine memory-backend=`, see the machine area).

use super::{Args, ArgvError, absolute, escape};
use crate::spec::LauncherSpec;

const MIB: u64 = 1024 * 1024;
/// DIMM slots reserved when memory hotplug is possible.
const HOTPLUG_SLOTS: u32 = 16;
const BACKEND_ID: &str = "guest-ram";

/// The id of the RAM backend object, when the spec needs one.
pub(super) fn backend_id(spec: &LauncherSpec) -> Option<&'static str> {
    spec.memory.hugepages.as_ref().map(|_| BACKEND_ID)
}

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let memory = &spec.memory;
    let guest = memory.guest_bytes;
    if guest == 0 || !guest.is_multiple_of(MIB) {
        return Err(ArgvError::Memory(format!(
            "guest memory {guest} is not a whole number of MiB"
        )));
    }
    let mut value = format!("size={}M", guest / MIB);
    match memory.max_guest_bytes {
        Some(max) if max < guest => {
            return Err(ArgvError::Memory(format!(
                "maxGuest {max} is below guest {guest}"
            )));
        }
        Some(max) if max > guest => {
            if !max.is_multiple_of(MIB) {
                return Err(ArgvError::Memory(format!(
                    "maxGuest {max} is not a whole number of MiB"
                )));
            }
            value.push_str(&format!(",slots={HOTPLUG_SLOTS},maxmem={}M", max / MIB));
        }
        _ => {}
    }
    args.push_pair("-m", value);
    if let Some(huge) = &memory.hugepages {
        let page = huge.page_size_bytes;
        if page == 0 || !page.is_power_of_two() || !guest.is_multiple_of(page) {
            return Err(ArgvError::Memory(format!(
                "guest memory {guest} is not a multiple of the huge page size {page}"
            )));
        }
        absolute("hugepages mount", &huge.mount_path)?;
        args.push_pair(
            "-object",
            format!(
                "memory-backend-file,id={BACKEND_ID},size={}M,mem-path={},prealloc=on,share=off",
                guest / MIB,
                escape(&huge.mount_path)
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{qemu_argv, tests::minimal_spec};
    use super::*;
    use crate::spec::Hugepages;

    #[test]
    fn max_guest_below_guest_is_refused() {
        let mut spec = minimal_spec();
        spec.memory.max_guest_bytes = Some(spec.memory.guest_bytes - MIB);
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(m)) if m.contains("below")));
    }

    #[test]
    fn max_guest_equal_to_guest_adds_no_hotplug_slots() {
        let mut spec = minimal_spec();
        spec.memory.max_guest_bytes = Some(spec.memory.guest_bytes);
        let argv = qemu_argv(&spec).unwrap();
        assert!(argv.contains(&"size=128M".to_owned()), "{argv:?}");
    }

    #[test]
    fn memory_that_is_not_whole_mebibytes_is_refused() {
        let mut spec = minimal_spec();
        spec.memory.guest_bytes = 128 * MIB + 512;
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(_))));
    }

    #[test]
    fn huge_pages_must_divide_guest_memory() {
        let mut spec = minimal_spec();
        spec.memory.guest_bytes = 1000 * MIB;
        spec.memory.hugepages = Some(Hugepages {
            page_size_bytes: 1024 * MIB,
            mount_path: "/dev/hugepages1G".into(),
        });
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Memory(_))));
    }
}
