//! Which backend runs the model: `auto` (a CUDA GPU when the driver finds one, else the CPU),
//! `cpu`, `cuda` or `cuda:N`.

use cachet_kernels::cuda::{probe, probe_device, CudaBackend, CudaDeviceInfo, CudaOptions};

/// What the operator asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = cachet_tenants::UnknownWord;

    fn from_str(s: &str) -> Result<DeviceChoice, cachet_tenants::UnknownWord> {
        match s.trim() {
            "" | "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
            other => {
                other.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(DeviceChoice::Cuda).ok_or_else(|| {
                    cachet_tenants::UnknownWord {
                        what: "device",
                        input: other.chars().take(64).collect(),
                        expected: "auto cpu cuda cuda:N",
                    }
                })
            }
        }
    }
}

/// The backend chosen.
#[derive(Clone, Debug)]
pub enum Device {
    Cpu,
    Cuda(CudaDeviceInfo),
}

/// Resolves `choice`: `auto` falls back to the CPU with one log line when no CUDA device is
/// usable; an explicit `cuda` without one is an error that says why.
pub fn select(choice: DeviceChoice) -> anyhow::Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto => match probe() {
            Ok(info) => {
                tracing::info!(device = %info.name, ordinal = info.ordinal, "CUDA device found; the model runs on it");
                Ok(Device::Cuda(info))
            }
            Err(e) => {
                tracing::info!("no CUDA device ({e}); the model runs on the CPU");
                Ok(Device::Cpu)
            }
        },
        DeviceChoice::Cuda(n) => {
            probe_device(n).map(Device::Cuda).map_err(|e| anyhow::anyhow!("device cuda:{n} is not usable: {e}"))
        }
    }
}

/// The CUDA backend on `info`'s device. By default only the dequantizing kernels run, so a
/// request's output does not depend on what else is in its batch (the engine's batch
/// invariance, `DESIGN.md`); `cublas_prefill` multiplies long prefills with cuBLAS on bf16 copies
/// of the weights instead — faster, but a row's result then depends on its batch's shape.
pub fn cuda_backend(info: &CudaDeviceInfo, cublas_prefill: bool) -> anyhow::Result<CudaBackend> {
    let mut options = if cublas_prefill { CudaOptions::default() } else { CudaOptions::batch_invariant() };
    // CACHET_CUDA_GRAPHS=1: repeated decode steps replay as CUDA graphs (off by default: see
    // docs/gpu.md for when that is faster).
    options.graphs = std::env::var("CACHET_CUDA_GRAPHS").is_ok_and(|v| v == "1");
    Ok(CudaBackend::with_options(info.ordinal, options)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse() {
        assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceChoice::Cuda(3)));
        assert!("tpu".parse::<DeviceChoice>().unwrap_err().to_string().contains("tpu"));
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }

    /// Without a GPU (CI): `auto` falls back to the CPU and `cuda` is a clear error. With one,
    /// both pick it.
    #[test]
    fn without_a_gpu_auto_is_the_cpu_and_cuda_is_an_error() {
        match probe() {
            Err(_) => {
                assert!(matches!(select(DeviceChoice::Auto).unwrap(), Device::Cpu));
                let e = select(DeviceChoice::Cuda(0)).unwrap_err().to_string();
                assert!(e.contains("cuda:0 is not usable"), "{e}");
            }
            Ok(_) => {
                assert!(matches!(select(DeviceChoice::Auto).unwrap(), Device::Cuda(_)));
                assert!(matches!(select(DeviceChoice::Cuda(0)).unwrap(), Device::Cuda(_)));
            }
        }
        assert!(matches!(select(DeviceChoice::Cpu).unwrap(), Device::Cpu));
    }
}
