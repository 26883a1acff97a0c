//! How a model file's bytes are held in host memory while the model runs.
//!
//! A backend that multiplies straight from host memory (the CPU) reads every weight once per
//! decode step. From a memory map those reads cross a 4 KiB page every 4 KiB: the hardware
//! prefetchers stop at page boundaries and each page costs a TLB entry, which hurts most when
//! the reads are scattered (a mixture of experts reads 8 of 128 experts' rows per layer). A
//! copy in anonymous memory advised for transparent huge pages lies in 2 MiB pages instead
//! (measured in `docs/performance.md`: 1.06–1.11× single-sequence decode, dense and MoE).
//! The copy also makes the weights count as used memory, so the KV pool, sized from the free
//! memory after loading, no longer counts the model's page cache as free.
//!
//! A backend that uploads the weights to a device (CUDA) reads them once: it keeps the map.
//! `CACHET_WEIGHTS=map` or `copy` overrides the choice.

use cachet_kernels::tensor::ByteOwner;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// Where the bytes of the weight files are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostWeights {
    /// Memory-mapped from the file (zero copy; the page cache holds them).
    Mapped,
    /// Read into anonymous memory advised for 2 MiB transparent huge pages.
    HugePages,
}

/// Spare memory a copy leaves for the KV pool and everything else.
const SPARE: u64 = 1 << 30;

const HUGE_PAGE: usize = 2 << 20;

/// A `CACHET_WEIGHTS` value that is neither `map` nor `copy` (the value, cut to 64 characters).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CACHET_WEIGHTS={0:?}: expected \"map\" or \"copy\"")]
pub struct BadWeightsSetting(pub String);

impl HostWeights {
    /// How the weights are held, for logs and reports.
    pub fn describe(self) -> &'static str {
        match self {
            HostWeights::Mapped => "memory-mapped",
            HostWeights::HugePages => "copied into 2 MiB pages",
        }
    }

    /// The choice for `file_bytes` of weights on a backend that does (`reads_host`) or does not
    /// compute from host memory, `available` bytes of memory free, with the reason; an error for
    /// a bad `CACHET_WEIGHTS`.
    pub fn choose(
        reads_host: bool,
        file_bytes: u64,
        available: Option<u64>,
    ) -> Result<(HostWeights, String), BadWeightsSetting> {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
        let env = std::env::var("CACHET_WEIGHTS").ok();
        HostWeights::decide(env.as_deref(), reads_host, file_bytes, thp.as_deref(), available)
    }

    /// [`HostWeights::choose`] on given facts: `env` (`CACHET_WEIGHTS`), `thp` (the kernel's
    /// `transparent_hugepage/enabled`), `available` (`MemAvailable` in bytes).
    pub fn decide(
        env: Option<&str>,
        reads_host: bool,
        file_bytes: u64,
        thp: Option<&str>,
        available: Option<u64>,
    ) -> Result<(HostWeights, String), BadWeightsSetting> {
        match env.map(str::trim).filter(|v| !v.is_empty()) {
            Some("map") => return Ok((HostWeights::Mapped, "CACHET_WEIGHTS=map".into())),
            Some("copy") => return Ok((HostWeights::HugePages, "CACHET_WEIGHTS=copy".into())),
            Some(other) => return Err(BadWeightsSetting(other.chars().take(64).collect())),
            None => {}
        }
        let mapped = |why: String| Ok((HostWeights::Mapped, why));
        if !reads_host {
            return mapped("the backend uploads them".into());
        }
        match thp {
            None => return mapped("no transparent huge pages in this kernel".into()),
            Some(t) if t.contains("[never]") => return mapped("transparent huge pages are off".into()),
            Some(_) => {}
        }
        match available {
            Some(a) if file_bytes.saturating_add(SPARE) > a => mapped(format!(
                "{} MiB of weights and 1 GiB to spare do not fit in the {} MiB of available memory",
                file_bytes >> 20,
                a >> 20
            )),
            _ => Ok((HostWeights::HugePages, "the CPU reads them every step".into())),
        }
    }
}

/// The bytes of the file at `path`, held as `how` says. A copy that cannot get its memory falls
/// back to a map (with a warning); a file that cannot be read is an error.
pub fn open(path: &Path, how: HostWeights) -> std::io::Result<Arc<dyn ByteOwner>> {
    let file = std::fs::File::open(path)?;
    if how == HostWeights::HugePages {
        if let Some(copy) = HugeCopy::read(&file)? {
            return Ok(Arc::new(copy));
        }
    }
    // SAFETY: a read-only map of a model file that cachet never writes while it is loaded (a file
    // changed under a live map is undefined, as with every mmap-based loader).
    Ok(Arc::new(unsafe { memmap2::Mmap::map(&file) }?))
}

/// A file's bytes in anonymous memory starting on a 2 MiB boundary.
struct HugeCopy {
    map: memmap2::Mmap,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for HugeCopy {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl HugeCopy {
    /// The copy; `None` when the memory cannot be had (the caller maps the file instead).
    fn read(mut file: &std::fs::File) -> std::io::Result<Option<HugeCopy>> {
        let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
        // One huge page more than needed, so that the bytes can start on a 2 MiB boundary
        // (the kernel backs only aligned 2 MiB ranges with huge pages).
        let mut map = match memmap2::MmapOptions::new().len(len + HUGE_PAGE).map_anon() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("weights: no memory for a copy ({e}); memory-mapping the file instead");
                return Ok(None);
            }
        };
        let start = (HUGE_PAGE - map.as_ptr() as usize % HUGE_PAGE) % HUGE_PAGE;
        if let Err(e) = map.advise(memmap2::Advice::HugePage) {
            tracing::debug!("weights: madvise(MADV_HUGEPAGE) failed ({e}); 4 KiB pages");
        }
        file.read_exact(&mut map[start..start + len])?;
        // A file that grew while it was read is caught by the parser's bounds; one that shrank
        // fails `read_exact` above.
        Ok(Some(HugeCopy { map: map.make_read_only()?, start, len }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEVER: &str = "always madvise [never]\n";
    const MADVISE: &str = "always [madvise] never\n";

    #[test]
    fn the_cpu_gets_a_copy_in_huge_pages_when_it_fits() {
        let gib = 1u64 << 30;
        let d = |env, reads, bytes, thp, avail| HostWeights::decide(env, reads, bytes, thp, avail).map(|r| r.0);
        assert_eq!(d(None, true, gib, Some(MADVISE), Some(4 * gib)), Ok(HostWeights::HugePages));
        assert_eq!(d(None, true, gib, Some(MADVISE), None), Ok(HostWeights::HugePages));
        assert_eq!(d(None, true, 3 * gib + 1, Some(MADVISE), Some(4 * gib)), Ok(HostWeights::Mapped));
        assert_eq!(d(None, true, gib, Some(NEVER), Some(4 * gib)), Ok(HostWeights::Mapped));
        assert_eq!(d(None, true, gib, None, Some(4 * gib)), Ok(HostWeights::Mapped));
        assert_eq!(d(None, false, gib, Some(MADVISE), Some(4 * gib)), Ok(HostWeights::Mapped));
        assert_eq!(d(Some("map"), true, gib, Some(MADVISE), Some(4 * gib)), Ok(HostWeights::Mapped));
        assert_eq!(d(Some("copy"), false, gib, Some(NEVER), Some(0)), Ok(HostWeights::HugePages));
        let err = d(Some("mmap"), true, gib, Some(MADVISE), None).unwrap_err();
        let err = err.to_string();
        assert!(err.contains("CACHET_WEIGHTS=\"mmap\"") && err.contains("\"map\" or \"copy\""), "{err}");
    }

    #[test]
    fn a_copy_holds_the_files_bytes_from_a_2_mib_boundary() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 4095, HUGE_PAGE + 12_345] {
            let path = dir.path().join(format!("w{len}"));
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            std::fs::write(&path, &bytes).unwrap();
            let copy = open(&path, HostWeights::HugePages).unwrap();
            let held: &[u8] = (*copy).as_ref();
            assert_eq!(held, &bytes[..], "{len} bytes");
            if len > 0 {
                assert_eq!(held.as_ptr() as usize % HUGE_PAGE, 0);
            }
            let mapped = open(&path, HostWeights::Mapped);
            // An empty file cannot be mapped on every kernel; a non-empty one can.
            if len > 0 {
                assert_eq!((*mapped.unwrap()).as_ref(), &bytes[..]);
            }
        }
        assert!(open(&dir.path().join("missing"), HostWeights::HugePages).is_err());
    }
}
