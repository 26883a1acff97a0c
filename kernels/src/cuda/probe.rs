//! Finding a CUDA device without ever panicking: the driver library is loaded
//! at run time (cudarc's dynamic loading), and cudarc panics when a library or
//! symbol is missing, so every call here first checks that the library loads
//! and runs behind `catch_unwind`.

use cudarc::driver::{result, sys, CudaContext};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What [`probe`] found: one CUDA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// Device ordinal (0 for the first GPU).
    pub ordinal: usize,
    /// Marketing name (`"NVIDIA H200"`).
    pub name: String,
    /// Compute capability `(major, minor)`, e.g. `(9, 0)`.
    pub compute_capability: (u32, u32),
    /// Device memory in bytes.
    pub total_memory: u64,
    /// Memory free for allocations right now, in bytes.
    pub free_memory: u64,
    /// Peak memory clock in kHz and memory bus width in bits, when the driver reports them.
    pub memory_clock_khz: Option<u32>,
    pub memory_bus_bits: Option<u32>,
}

impl CudaDeviceInfo {
    /// The theoretical peak memory bandwidth in GB/s (double data rate: 2 × clock × bus width),
    /// when the driver reports the clock and the bus width.
    pub fn peak_bandwidth_gbs(&self) -> Option<f64> {
        let (clock, bits) = (self.memory_clock_khz?, self.memory_bus_bits?);
        Some(2.0 * f64::from(clock) * 1e3 * f64::from(bits) / 8.0 / 1e9)
    }
}

impl std::fmt::Display for CudaDeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "{} (cuda:{}, sm_{}{}, {:.1} GiB, {:.1} GiB free)",
            self.name,
            self.ordinal,
            self.compute_capability.0,
            self.compute_capability.1,
            gib(self.total_memory),
            gib(self.free_memory)
        )
    }
}

/// Why no CUDA device can be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaUnavailable {
    /// The driver library (`libcuda.so`) cannot be loaded: no NVIDIA driver.
    #[error("no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver installed)")]
    NoDriver,
    /// The driver loaded but has no device with this ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice { ordinal: usize, count: usize },
    /// The driver failed (e.g. a driver/kernel-module mismatch, or a device in use).
    #[error("the CUDA driver failed: {0}")]
    Driver(String),
}

/// The first CUDA device, or why there is none. Never panics.
pub fn probe() -> Result<CudaDeviceInfo, CudaUnavailable> {
    probe_device(0)
}

/// CUDA device `ordinal`, or why it cannot be used. Never panics.
pub fn probe_device(ordinal: usize) -> Result<CudaDeviceInfo, CudaUnavailable> {
    guarded(|| {
        let count = device_count()?;
        if ordinal >= count {
            return Err(CudaUnavailable::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        info(&ctx)
    })
}

/// Number of CUDA devices (0 when there is no driver).
pub fn device_count() -> Result<usize, CudaUnavailable> {
    guarded(|| {
        if !driver_loads() {
            return Err(CudaUnavailable::NoDriver);
        }
        match result::init() {
            // A driver without a GPU (or with every GPU hidden).
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => return Ok(0),
            r => r.map_err(driver)?,
        }
        let n = result::device::get_count().map_err(driver)?;
        Ok(n.max(0) as usize)
    })
}

/// Whether the driver library can be loaded.
fn driver_loads() -> bool {
    // SAFETY: only tries to open the library (libloading), touching no state.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Details of the device behind `ctx`.
pub(crate) fn info(ctx: &CudaContext) -> Result<CudaDeviceInfo, CudaUnavailable> {
    let name = ctx.name().map_err(driver)?;
    let (major, minor) = ctx.compute_capability().map_err(driver)?;
    let (free, total) = ctx.mem_get_info().map_err(driver)?;
    let attribute = |a| ctx.attribute(a).ok().filter(|v| *v > 0).map(|v| v as u32);
    Ok(CudaDeviceInfo {
        memory_clock_khz: attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        memory_bus_bits: attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        ordinal: ctx.ordinal(),
        name,
        compute_capability: (major.max(0) as u32, minor.max(0) as u32),
        total_memory: total as u64,
        free_memory: free as u64,
    })
}

fn driver(e: result::DriverError) -> CudaUnavailable {
    CudaUnavailable::Driver(e.to_string())
}

/// Runs `f`, turning a panic inside cudarc (a missing library or symbol) into
/// an error.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, CudaUnavailable>) -> Result<T, CudaUnavailable> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(CudaUnavailable::Driver(format!("the CUDA driver library is unusable: {msg}")))
        }
    }
}
