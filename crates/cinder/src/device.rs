//! Which backend runs the model. Cargo features decide which backends are compiled in
//! (`flex` by default, `ndarray`, `wgpu`); `--device` picks one of them at start-up.

use burn::prelude::*;

/// Where to run, as asked on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum DeviceChoice {
    /// The GPU when cinder was built with `--features wgpu`, else the CPU.
    #[default]
    Auto,
    /// The CPU backend (flex, or ndarray when built with only that feature).
    Cpu,
    /// The GPU through wgpu (needs `--features wgpu`).
    Gpu,
}

/// The asked-for backend is not available.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "this cinder was built without a CPU backend: rebuild with the default features, \
         or pass --device gpu"
    )]
    NoCpuBackend,
    #[error(
        "this cinder was built without GPU support: rebuild with \
         `cargo build --release --features wgpu`, or pass --device cpu"
    )]
    NoGpuBackend,
    #[error(
        "wgpu found no usable graphics adapter ({0}). On Linux install a Vulkan driver \
         (Debian/Ubuntu: `apt-get install mesa-vulkan-drivers libvulkan1`, or your GPU vendor's \
         driver); or run on the CPU with --device cpu"
    )]
    NoAdapter(String),
}

/// A device to run on, with the name of its backend for messages and checkpoints.
#[derive(Debug, Clone)]
pub struct Backend {
    pub device: Device,
    /// `flex`, `ndarray` or `wgpu`.
    pub name: &'static str,
}

impl Backend {
    /// Picks the backend for `choice` among those compiled in.
    pub fn select(choice: DeviceChoice) -> Result<Self, DeviceError> {
        match choice {
            DeviceChoice::Cpu => Self::cpu(),
            DeviceChoice::Gpu => Self::gpu(),
            DeviceChoice::Auto => Self::gpu().or_else(|gpu_err| match gpu_err {
                DeviceError::NoGpuBackend => Self::cpu(),
                other => Err(other),
            }),
        }
    }

    /// The CPU backend compiled in: flex, else ndarray.
    #[allow(unreachable_code)]
    pub fn cpu() -> Result<Self, DeviceError> {
        #[cfg(feature = "flex")]
        return Ok(Self {
            device: Device::flex(),
            name: "flex",
        });
        // Deprecated in Burn 0.22 in favour of flex, and kept as the alternative CPU backend.
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        return Ok(Self {
            device: Device::ndarray(),
            name: "ndarray",
        });
        Err(DeviceError::NoCpuBackend)
    }

    /// The wgpu backend, checked to have an adapter.
    #[allow(unreachable_code)]
    pub fn gpu() -> Result<Self, DeviceError> {
        #[cfg(feature = "wgpu")]
        {
            // One stream for the whole process. CubeCL gives each OS thread a stream of its own
            // by default, and a training step runs on whichever of rayon's threads takes it
            // (`run::pool`), so consecutive steps ran on different streams, and the hand-over
            // between them sometimes changed a step (a race, we infer): resumed on lavapipe with
            // the same tuned kernels, 3 runs in 10 took a step 0.05 apart, and 0 in 10 on one
            // stream (BENCHMARKS.md, section 31). cinder submits from one thread at a time, so a
            // single stream loses no concurrency.
            cubecl_environment::stream::set_policy(
                cubecl_environment::stream::StreamPolicy::Single,
            );
            let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
            probe(&device)?;
            return Ok(Self {
                device,
                name: "wgpu",
            });
        }
        Err(DeviceError::NoGpuBackend)
    }

    /// Whether this is a CPU backend (flex or ndarray).
    pub fn is_cpu(&self) -> bool {
        self.name != "wgpu"
    }

    /// One line for start-up: backend and device.
    pub fn describe(&self) -> String {
        let kind = if self.is_cpu() { "CPU" } else { "GPU" };
        format!("backend {} ({kind}), device {:?}", self.name, self.device)
    }
}

/// Runs one tiny operation so that a missing adapter is an error now, not a panic later. The
/// error carries the first panic message of any thread meanwhile (wgpu starts the device on a
/// thread of its own, whose message says what was missing), and nothing is printed.
#[cfg(feature = "wgpu")]
fn probe(device: &Device) -> Result<(), DeviceError> {
    use std::sync::{Arc, Mutex};
    let device = device.clone();
    let first: Arc<Mutex<Option<String>>> = Arc::default();
    let sink = first.clone();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()));
        let mut first = sink.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = msg;
        }
    }));
    let result = std::panic::catch_unwind(move || {
        Tensor::<1>::ones([1], &device).sum().into_scalar::<f32>()
    });
    std::panic::set_hook(hook);
    match result {
        Ok(_) => Ok(()),
        Err(_) => {
            let msg = first
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .unwrap_or_else(|| "no detail".into());
            Err(DeviceError::NoAdapter(msg))
        }
    }
}
