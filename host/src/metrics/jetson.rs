//! GPU gauges on Jetson, where NVML does not exist: GPU load and clocks
//! (devfreq), the EMC clock, the INA3221 power rails, thermal zones and
//! unified memory, read from sysfs and `/proc` at scrape time. Triton's names
//! (`nv_gpu_utilization`, `nv_gpu_power_usage`, `nv_gpu_memory_*_bytes`) carry
//! what Triton has a name for, labelled `gpu_uuid="jetson-igpu"`; the rest is
//! exported as `tern_jetson_*`.
//!
//! The layout is found once ([`probe`]): which devfreq node is the GPU, which
//! power monitor folders and thermal zones exist. Every file is read again at
//! each scrape and each one is optional: one that is missing or unreadable
//! leaves its sample out. `TERN_SYSFS_ROOT` (a folder holding `sys/` and
//! `proc/`, default `/`) moves the whole tree, for tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tern_core::prometheus::{header, labels, sample};

/// The `gpu_uuid` label value of the Jetson's integrated GPU (it has no UUID).
pub const GPU_UUID: &str = "jetson-igpu";

/// The environment variable that moves the sysfs/proc root.
pub const ROOT_ENV: &str = "TERN_SYSFS_ROOT";

/// Rail labels that carry the GPU, best first; after them, the first rail
/// whose label contains `GPU` (`VDD_CPU_GPU_CV` on Orin NX/Nano, Xavier NX).
const GPU_RAILS: [&str; 3] = ["VDD_GPU_SOC", "GPU", "VDD_GPU"];

/// Devfreq node suffixes (`17000000.ga10b`) and device-tree names of Jetson GPUs.
const GPU_NODES: [&str; 4] = ["ga10b", "gv11b", "gp10b", "gpu"];

/// One INA3221 channel: its label and the files that read it.
#[derive(Debug, Clone)]
struct Rail {
    name: String,
    /// Bus voltage, mV.
    volts_mv: Option<PathBuf>,
    /// Current, mA.
    amps_ma: Option<PathBuf>,
    /// Power, mW (the JetPack 4 iio driver has it; hwmon does not).
    watts_mw: Option<PathBuf>,
}

/// A thermal zone: its label (`type`, made unique) and its `temp` file.
#[derive(Debug, Clone)]
struct Zone {
    name: String,
    temp: PathBuf,
}

/// What [`Jetson::detect`] found.
#[derive(Debug, Clone)]
pub struct Jetson {
    /// The GPU's devfreq node name (`17000000.gpu`).
    node: String,
    /// The devfreq folder (`cur_freq`, `max_freq`).
    devfreq: PathBuf,
    /// The GPU load file (per mille).
    load: Option<PathBuf>,
    /// The EMC clock folder in debugfs (`rate`, `max_rate`, Hz), when readable.
    emc: Option<PathBuf>,
    /// `proc/meminfo`.
    meminfo: PathBuf,
    rails: Vec<Rail>,
    /// Which power monitor driver the rails come from.
    rail_driver: &'static str,
    zones: Vec<Zone>,
}

/// One rail's reading.
#[derive(Debug)]
struct RailReading {
    name: String,
    volts: Option<f64>,
    amps: Option<f64>,
    watts: Option<f64>,
}

/// One reading of every file.
#[derive(Debug, Default)]
struct Reading {
    load: Option<f64>,
    gpu_hz: Option<f64>,
    gpu_max_hz: Option<f64>,
    emc_hz: Option<f64>,
    emc_max_hz: Option<f64>,
    memory: Option<(f64, f64)>,
    rails: Vec<RailReading>,
    gpu_watts: Option<f64>,
    zones: Vec<(String, f64)>,
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// The first number in a file (`cur_freq` is `306000000`, some power files
/// add a unit after a space).
fn read_number(path: &Path) -> Option<f64> {
    read_trimmed(path)?
        .split_whitespace()
        .next()?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
}

/// The entries of a folder, sorted by name (missing folder: none).
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|a| natural_key(&a.0));
    v
}

/// Sort key putting `thermal_zone10` after `thermal_zone9`.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, num) = name.split_at(name.len() - digits);
    (stem.to_owned(), num.parse().unwrap_or(0))
}

/// The number after `prefix` and before `suffix` in `name` (`in2_label` → 2).
fn channel(name: &str, prefix: &str, suffix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

/// Whether the board is an NVIDIA Tegra (every Jetson's device tree lists
/// `nvidia,tegra<soc>` among its compatibles): other boards' GPUs (Mali,
/// Adreno) have devfreq nodes named `*.gpu` too, and are not read.
fn is_tegra(root: &Path) -> bool {
    [
        "sys/firmware/devicetree/base/compatible",
        "proc/device-tree/compatible",
    ]
    .iter()
    .any(|rel| {
        fs::read(root.join(rel)).is_ok_and(|b| {
            b.split(|c| *c == 0 || *c == b'\n')
                .any(|s| s.starts_with(b"nvidia,tegra"))
        })
    })
}

/// Whether a devfreq node is a Jetson GPU: by its name's suffix
/// (`17000000.ga10b`, `17000000.gpu`) or its device-tree node name.
fn is_gpu_node(name: &str, dir: &Path) -> bool {
    let suffix = name.rsplit('.').next().unwrap_or(name);
    GPU_NODES.contains(&suffix)
        || read_trimmed(&dir.join("device/of_node/name"))
            .is_some_and(|n| GPU_NODES.contains(&n.to_ascii_lowercase().as_str()))
}

/// INA3221 channels through the hwmon driver (JetPack 5 and 6):
/// `ina3221/<bus-addr>/hwmon/hwmon<k>/in<N>_label`, `in<N>_input` (mV),
/// `curr<N>_input` (mA).
fn hwmon_rails(sys: &Path) -> Vec<Rail> {
    let mut rails = Vec::new();
    for (_, chip) in entries(&sys.join("bus/i2c/drivers/ina3221")) {
        for (_, hwmon) in entries(&chip.join("hwmon")) {
            let mut found: Vec<(u32, Rail)> = entries(&hwmon)
                .into_iter()
                .filter_map(|(file, path)| {
                    let n = channel(&file, "in", "_label")?;
                    let name = read_trimmed(&path)?;
                    Some((n, name))
                })
                .filter(|(_, name)| usable_label(name))
                .map(|(n, name)| {
                    let existing = |f: String| Some(hwmon.join(f)).filter(|p| p.exists());
                    let rail = Rail {
                        name,
                        volts_mv: existing(format!("in{n}_input")),
                        amps_ma: existing(format!("curr{n}_input")),
                        watts_mw: None,
                    };
                    (n, rail)
                })
                .collect();
            found.sort_by_key(|(n, _)| *n);
            rails.extend(found.into_iter().map(|(_, r)| r));
        }
    }
    rails
}

/// INA3221 channels through NVIDIA's `ina3221x` iio driver (JetPack 4):
/// `ina3221x/<bus-addr>/iio:device<k>/rail_name_<N>`, `in_voltage<N>_input`
/// (mV), `in_current<N>_input` (mA), `in_power<N>_input` (mW).
fn iio_rails(sys: &Path) -> Vec<Rail> {
    let mut rails = Vec::new();
    for (_, chip) in entries(&sys.join("bus/i2c/drivers/ina3221x")) {
        for (dev, dir) in entries(&chip) {
            if !dev.starts_with("iio:device") && dev != "iio_device" {
                continue;
            }
            let mut found: Vec<(u32, Rail)> = entries(&dir)
                .into_iter()
                .filter_map(|(file, path)| {
                    let n = channel(&file, "rail_name_", "")?;
                    Some((n, read_trimmed(&path)?))
                })
                .filter(|(_, name)| usable_label(name))
                .map(|(n, name)| {
                    let existing = |f: String| Some(dir.join(f)).filter(|p| p.exists());
                    let rail = Rail {
                        name,
                        volts_mv: existing(format!("in_voltage{n}_input")),
                        amps_ma: existing(format!("in_current{n}_input")),
                        watts_mw: existing(format!("in_power{n}_input")),
                    };
                    (n, rail)
                })
                .collect();
            found.sort_by_key(|(n, _)| *n);
            rails.extend(found.into_iter().map(|(_, r)| r));
        }
    }
    rails
}

/// Unconnected channels (`NC`) and the driver's sum channel are not rails.
fn usable_label(name: &str) -> bool {
    !name.is_empty() && name != "NC" && !name.to_ascii_lowercase().starts_with("sum of")
}

/// `thermal_zone<N>/type` and `temp`; a repeated type gets `_<N>` appended.
fn thermal_zones(sys: &Path) -> Vec<Zone> {
    let mut zones: Vec<Zone> = Vec::new();
    for (file, dir) in entries(&sys.join("class/thermal")) {
        let Some(n) = channel(&file, "thermal_zone", "") else {
            continue;
        };
        let Some(kind) = read_trimmed(&dir.join("type")) else {
            continue;
        };
        let name = if zones.iter().any(|z| z.name == kind) {
            format!("{kind}_{n}")
        } else {
            kind
        };
        zones.push(Zone {
            name,
            temp: dir.join("temp"),
        });
    }
    zones
}

impl Jetson {
    /// Looks for a Jetson GPU under `root` (a folder holding `sys/` and
    /// `proc/`); `None` where no devfreq node is a Jetson GPU.
    pub fn detect(root: &Path) -> Option<Jetson> {
        if !is_tegra(root) {
            return None;
        }
        let sys = root.join("sys");
        let (node, devfreq) = entries(&sys.join("class/devfreq"))
            .into_iter()
            .find(|(name, dir)| is_gpu_node(name, dir))?;
        // The load file sits in the GPU's device folder; older layouts also
        // have it under a `gpu.0` platform device.
        let load = [
            devfreq.join("device/load"),
            sys.join("devices/platform/gpu.0/load"),
            sys.join("devices/gpu.0/load"),
        ]
        .into_iter()
        .find(|p| p.exists());
        let emc = Some(sys.join("kernel/debug/bpmp/debug/clk/emc"))
            .filter(|d| fs::File::open(d.join("rate")).is_ok());
        let (rails, rail_driver) = match hwmon_rails(&sys) {
            r if !r.is_empty() => (r, "ina3221 hwmon"),
            _ => (iio_rails(&sys), "ina3221x iio"),
        };
        Some(Jetson {
            node,
            devfreq,
            load,
            emc,
            meminfo: root.join("proc/meminfo"),
            rails,
            rail_driver,
            zones: thermal_zones(&sys),
        })
    }

    /// The board and layout the GPU's devfreq node names, for the log.
    pub fn layout(&self) -> String {
        let suffix = self.node.rsplit('.').next().unwrap_or(&self.node);
        match (self.node.as_str(), suffix) {
            ("17000000.gpu", _) => "Orin (JetPack 6 layout)".to_owned(),
            (_, "ga10b") => "Orin (JetPack 5 layout)".to_owned(),
            (_, "gv11b") => "Xavier (JetPack 5 layout)".to_owned(),
            (_, "gp10b") => "TX2 (JetPack 4 layout)".to_owned(),
            _ => format!("GPU devfreq node {}", self.node),
        }
    }

    /// One line saying what was found.
    pub fn describe(&self) -> String {
        let rails = if self.rails.is_empty() {
            "no power rails".to_owned()
        } else {
            format!("{} power rails ({})", self.rails.len(), self.rail_driver)
        };
        format!(
            "{}, {}, {} thermal zones, GPU load {}, EMC clock {}",
            self.layout(),
            rails,
            self.zones.len(),
            if self.load.is_some() {
                "readable"
            } else {
                "absent"
            },
            if self.emc.is_some() {
                "readable"
            } else {
                "not readable (debugfs needs root)"
            },
        )
    }

    fn read(&self) -> Reading {
        let rails: Vec<RailReading> = self
            .rails
            .iter()
            .map(|r| {
                let v = r.volts_mv.as_deref().and_then(read_number).map(|x| x / 1e3);
                let a = r.amps_ma.as_deref().and_then(read_number).map(|x| x / 1e3);
                let w = r
                    .watts_mw
                    .as_deref()
                    .and_then(read_number)
                    .map(|x| x / 1e3)
                    .or_else(|| Some(v? * a?));
                RailReading {
                    name: r.name.clone(),
                    volts: v,
                    amps: a,
                    watts: w,
                }
            })
            .collect();
        let gpu_watts = GPU_RAILS
            .iter()
            .find_map(|want| rails.iter().find(|r| r.name == *want))
            .or_else(|| {
                rails
                    .iter()
                    .find(|r| r.name.to_ascii_uppercase().contains("GPU"))
            })
            .and_then(|r| r.watts);
        Reading {
            load: self
                .load
                .as_deref()
                .and_then(read_number)
                .map(|permille| (permille / 1000.0).clamp(0.0, 1.0)),
            gpu_hz: read_number(&self.devfreq.join("cur_freq")),
            gpu_max_hz: read_number(&self.devfreq.join("max_freq")),
            emc_hz: self.emc.as_ref().and_then(|d| read_number(&d.join("rate"))),
            emc_max_hz: self
                .emc
                .as_ref()
                .and_then(|d| read_number(&d.join("max_rate"))),
            memory: read_meminfo(&self.meminfo),
            rails,
            gpu_watts,
            zones: self
                .zones
                .iter()
                .filter_map(|z| Some((z.name.clone(), read_number(&z.temp)? / 1e3)))
                .collect(),
        }
    }

    /// Renders every family that has a reading.
    pub fn render(&self, out: &mut String) {
        let r = self.read();
        let gpu = labels(&[("gpu_uuid", GPU_UUID)]);
        // Name, help, whether labelled with the GPU, reading.
        let scalars: [(&str, &str, bool, Option<f64>); 8] = [
            (
                "nv_gpu_utilization",
                "GPU utilization rate [0.0 - 1.0)",
                true,
                r.load,
            ),
            (
                "nv_gpu_memory_total_bytes",
                "GPU total memory, in bytes",
                true,
                r.memory.map(|m| m.0),
            ),
            (
                "nv_gpu_memory_used_bytes",
                "GPU used memory, in bytes",
                true,
                r.memory.map(|m| m.1),
            ),
            (
                "nv_gpu_power_usage",
                "GPU power usage in watts",
                true,
                r.gpu_watts,
            ),
            (
                "tern_jetson_gpu_frequency_hz",
                "Jetson GPU clock (devfreq cur_freq), in Hz",
                true,
                r.gpu_hz,
            ),
            (
                "tern_jetson_gpu_max_frequency_hz",
                "Jetson GPU clock ceiling (devfreq max_freq), in Hz",
                true,
                r.gpu_max_hz,
            ),
            (
                "tern_jetson_emc_frequency_hz",
                "Jetson memory controller (EMC) clock, in Hz",
                false,
                r.emc_hz,
            ),
            (
                "tern_jetson_emc_max_frequency_hz",
                "Jetson memory controller (EMC) clock ceiling, in Hz",
                false,
                r.emc_max_hz,
            ),
        ];
        for (name, help, on_gpu, value) in scalars {
            if let Some(v) = value {
                header(out, name, "gauge", help);
                sample(out, name, if on_gpu { &gpu } else { "" }, v);
            }
        }
        render_rails(out, &r.rails);
        if !r.zones.is_empty() {
            let name = "tern_jetson_temperature_celsius";
            header(out, name, "gauge", "Jetson thermal zone temperature, in °C");
            for (zone, v) in &r.zones {
                sample(out, name, &labels(&[("zone", zone.as_str())]), *v);
            }
        }
    }
}

/// The rail families, labelled `rail`, each only where some rail has a reading.
fn render_rails(out: &mut String, rails: &[RailReading]) {
    type Pick = fn(&RailReading) -> Option<f64>;
    let families: [(&str, &str, Pick); 3] = [
        (
            "tern_jetson_power_rail_watts",
            "Jetson power rail (INA3221 channel) power, in watts",
            |r| r.watts,
        ),
        (
            "tern_jetson_power_rail_volts",
            "Jetson power rail (INA3221 channel) bus voltage, in volts",
            |r| r.volts,
        ),
        (
            "tern_jetson_power_rail_amps",
            "Jetson power rail (INA3221 channel) current, in amperes",
            |r| r.amps,
        ),
    ];
    for (name, help, pick) in families {
        let rows: Vec<(&str, f64)> = rails
            .iter()
            .filter_map(|row| Some((row.name.as_str(), pick(row)?)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        header(out, name, "gauge", help);
        for (rail, v) in rows {
            sample(out, name, &labels(&[("rail", rail)]), v);
        }
    }
}

/// Total and used (total − available) memory from `/proc/meminfo`, in bytes.
fn read_meminfo(path: &Path) -> Option<(f64, f64)> {
    let text = fs::read_to_string(path).ok()?;
    let field = |key: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let kb: f64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
        Some(kb * 1024.0)
    };
    let total = field("MemTotal:")?;
    let available = field("MemAvailable:")?;
    Some((total, (total - available).max(0.0)))
}

fn detected() -> Option<&'static Jetson> {
    static JETSON: OnceLock<Option<Jetson>> = OnceLock::new();
    JETSON
        .get_or_init(|| {
            let root = std::env::var_os(ROOT_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/"));
            let found = Jetson::detect(&root);
            match &found {
                Some(j) => tracing::info!("Jetson GPU metrics from sysfs: {}", j.describe()),
                None => tracing::debug!(
                    "no Jetson GPU under {}: no Jetson GPU metrics",
                    root.display()
                ),
            }
            found
        })
        .as_ref()
}

/// Looks for a Jetson layout (once) and logs what was found.
pub fn probe() {
    let _ = detected();
}

/// Renders the Jetson families (nothing where no Jetson GPU was found).
pub fn render(out: &mut String) {
    if let Some(j) = detected() {
        j.render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Writes `text` at `root/rel`, creating folders.
    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().expect("a file path has a parent")).expect("mkdir");
        fs::write(&p, format!("{text}\n")).expect("write");
    }

    /// A devfreq node as sysfs lays it out: the class entry is a link into the
    /// device's `devfreq/` folder, whose `device` links back to the device.
    fn devfreq(root: &Path, device: &str, node: &str, cur: u64, max: u64, load: Option<u32>) {
        let dev = root.join("sys/devices").join(device);
        let df = dev.join("devfreq").join(node);
        fs::create_dir_all(&df).expect("mkdir");
        fs::write(df.join("cur_freq"), format!("{cur}\n")).expect("write");
        fs::write(df.join("max_freq"), format!("{max}\n")).expect("write");
        symlink(&dev, df.join("device")).expect("symlink");
        fs::create_dir_all(dev.join("of_node")).expect("mkdir");
        if let Some(l) = load {
            fs::write(dev.join("load"), format!("{l}\n")).expect("write");
        }
        let class = root.join("sys/class/devfreq");
        fs::create_dir_all(&class).expect("mkdir");
        symlink(&df, class.join(node)).expect("symlink");
        let compatible = root.join("sys/firmware/devicetree/base/compatible");
        fs::create_dir_all(compatible.parent().expect("parent")).expect("mkdir");
        fs::write(
            compatible,
            b"nvidia,p3737-0000+p3701-0000\0nvidia,tegra234\0",
        )
        .expect("write");
    }

    fn hwmon(root: &Path, chip: &str, k: u32, rails: &[(u32, &str, u32, u32)]) {
        let dir = format!("sys/bus/i2c/drivers/ina3221/{chip}/hwmon/hwmon{k}");
        put(root, &format!("{dir}/name"), "ina3221");
        for (n, label, mv, ma) in rails {
            put(root, &format!("{dir}/in{n}_label"), label);
            put(root, &format!("{dir}/in{n}_input"), &mv.to_string());
            put(root, &format!("{dir}/curr{n}_input"), &ma.to_string());
        }
        // The driver's sum channel, which is not a rail.
        put(root, &format!("{dir}/in7_label"), "sum of shunt voltages");
        put(root, &format!("{dir}/in7_input"), "120");
    }

    fn zones(root: &Path, zones: &[(&str, i64)]) {
        // /sys/class/thermal entries are links into /sys/devices/virtual/thermal.
        for (i, (kind, milli)) in zones.iter().enumerate() {
            let dev = root.join(format!("sys/devices/virtual/thermal/thermal_zone{i}"));
            fs::create_dir_all(&dev).expect("mkdir");
            fs::write(dev.join("type"), format!("{kind}\n")).expect("write");
            fs::write(dev.join("temp"), format!("{milli}\n")).expect("write");
            let class = root.join("sys/class/thermal");
            fs::create_dir_all(&class).expect("mkdir");
            symlink(&dev, class.join(format!("thermal_zone{i}"))).expect("symlink");
        }
        // Cooling devices share the folder and are not zones.
        put(root, "sys/class/thermal/cooling_device0/type", "pwm-fan");
    }

    fn meminfo(root: &Path) {
        put(
            root,
            "proc/meminfo",
            "MemTotal:       31000000 kB\nMemFree:        20000000 kB\nMemAvailable:   25000000 kB\nBuffers:          100000 kB",
        );
    }

    /// AGX Orin on JetPack 6 (L4T r36): `17000000.gpu` under `bus@0`, the
    /// hwmon INA3221 driver at 1-0040 and 1-0041.
    fn orin_jp6(root: &Path) {
        devfreq(
            root,
            "platform/bus@0/17000000.gpu",
            "17000000.gpu",
            306_000_000,
            1_300_500_000,
            Some(523),
        );
        put(
            root,
            "sys/devices/platform/bus@0/17000000.gpu/of_node/name",
            "gpu",
        );
        hwmon(
            root,
            "1-0040",
            1,
            &[
                (1, "VDD_GPU_SOC", 5008, 1592),
                (2, "VDD_CPU_CV", 5016, 400),
                (3, "VIN_SYS_5V0", 5000, 600),
            ],
        );
        hwmon(root, "1-0041", 2, &[(2, "VDDQ_VDD2_1V8AO", 5000, 200)]);
        zones(
            root,
            &[
                ("cpu-thermal", 45_593),
                ("gpu-thermal", 43_468),
                ("cv0-thermal", 44_000),
                ("cv1-thermal", 44_125),
                ("cv2-thermal", 43_906),
                ("soc0-thermal", 44_218),
                ("soc1-thermal", 43_562),
                ("soc2-thermal", 43_000),
                ("tj-thermal", 45_593),
            ],
        );
        meminfo(root);
    }

    fn render_from(root: &Path) -> String {
        let j = Jetson::detect(root).expect("a Jetson layout");
        let mut out = String::new();
        j.render(&mut out);
        out
    }

    #[test]
    fn orin_jetpack6() {
        let dir = tempfile::tempdir().expect("tempdir");
        orin_jp6(dir.path());
        let j = Jetson::detect(dir.path()).expect("a Jetson layout");
        assert_eq!(
            j.describe(),
            "Orin (JetPack 6 layout), 4 power rails (ina3221 hwmon), 9 thermal zones, \
             GPU load readable, EMC clock not readable (debugfs needs root)"
        );
        let out = render_from(dir.path());
        for line in [
            "# TYPE nv_gpu_utilization gauge",
            "nv_gpu_utilization{gpu_uuid=\"jetson-igpu\"} 0.523",
            "nv_gpu_memory_total_bytes{gpu_uuid=\"jetson-igpu\"} 31744000000",
            "nv_gpu_memory_used_bytes{gpu_uuid=\"jetson-igpu\"} 6144000000",
            "tern_jetson_gpu_frequency_hz{gpu_uuid=\"jetson-igpu\"} 306000000",
            "tern_jetson_gpu_max_frequency_hz{gpu_uuid=\"jetson-igpu\"} 1300500000",
            "tern_jetson_power_rail_volts{rail=\"VDD_GPU_SOC\"} 5.008",
            "tern_jetson_power_rail_amps{rail=\"VDD_GPU_SOC\"} 1.592",
            "tern_jetson_power_rail_amps{rail=\"VDDQ_VDD2_1V8AO\"} 0.2",
            "tern_jetson_temperature_celsius{zone=\"gpu-thermal\"} 43.468",
            "tern_jetson_temperature_celsius{zone=\"tj-thermal\"} 45.593",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        // The GPU rail's power is volts × amps.
        let watts = |rail: &str| -> f64 {
            let prefix = format!("tern_jetson_power_rail_watts{{rail=\"{rail}\"}} ");
            out.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{rail} watts missing from\n{out}"))
        };
        assert!((watts("VDD_GPU_SOC") - 5.008 * 1.592).abs() < 1e-9);
        let gpu_power: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("nv_gpu_power_usage{gpu_uuid=\"jetson-igpu\"} "))
            .and_then(|v| v.parse().ok())
            .expect("nv_gpu_power_usage");
        assert!((gpu_power - 5.008 * 1.592).abs() < 1e-9);
        assert!(!out.contains("sum of shunt"), "{out}");
        assert!(!out.contains("tern_jetson_emc"), "{out}");
        // Rails in chip then channel order.
        let rails: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("tern_jetson_power_rail_watts{"))
            .collect();
        assert_eq!(rails.len(), 4);
        assert!(rails[0].contains("VDD_GPU_SOC") && rails[3].contains("VDDQ_VDD2_1V8AO"));
    }

    #[test]
    fn perf_analyzer_parses_the_gpu_families() {
        // perf_analyzer reads each family with this pattern and the label set
        // must be exactly gpu_uuid.
        let dir = tempfile::tempdir().expect("tempdir");
        orin_jp6(dir.path());
        let out = render_from(dir.path());
        for family in [
            "nv_gpu_utilization",
            "nv_gpu_power_usage",
            "nv_gpu_memory_used_bytes",
            "nv_gpu_memory_total_bytes",
        ] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{family}{{")))
                .unwrap_or_else(|| panic!("{family} missing"));
            let rest = line
                .strip_prefix(&format!("{family}{{gpu_uuid=\"{GPU_UUID}\"}} "))
                .unwrap_or_else(|| panic!("{line}"));
            let (int, frac) = rest.split_once('.').unwrap_or((rest, ""));
            assert!(
                !int.is_empty()
                    && int.chars().all(|c| c.is_ascii_digit())
                    && frac.chars().all(|c| c.is_ascii_digit()),
                "{line}"
            );
        }
    }

    /// AGX Orin on JetPack 5 (L4T r35): `17000000.ga10b`, load also under
    /// `gpu.0`, EMC clock readable (running as root).
    #[test]
    fn orin_jetpack5() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        devfreq(
            root,
            "17000000.ga10b",
            "17000000.ga10b",
            1_300_500_000,
            1_300_500_000,
            None,
        );
        put(root, "sys/devices/gpu.0/load", "999");
        put(
            root,
            "sys/kernel/debug/bpmp/debug/clk/emc/rate",
            "3199000000",
        );
        put(
            root,
            "sys/kernel/debug/bpmp/debug/clk/emc/max_rate",
            "3199000000",
        );
        hwmon(
            root,
            "1-0040",
            3,
            &[
                (1, "VDD_GPU_SOC", 4992, 4000),
                (2, "VDD_CPU_CV", 5000, 800),
                (3, "VIN_SYS_5V0", 5000, 700),
            ],
        );
        zones(root, &[("CPU-therm", 50_000), ("GPU-therm", 48_500)]);
        meminfo(root);
        let j = Jetson::detect(root).expect("a Jetson layout");
        assert!(j
            .describe()
            .starts_with("Orin (JetPack 5 layout), 3 power rails"));
        let out = render_from(root);
        for line in [
            "nv_gpu_utilization{gpu_uuid=\"jetson-igpu\"} 0.999",
            "tern_jetson_gpu_frequency_hz{gpu_uuid=\"jetson-igpu\"} 1300500000",
            "tern_jetson_emc_frequency_hz 3199000000",
            "tern_jetson_emc_max_frequency_hz 3199000000",
            "tern_jetson_power_rail_volts{rail=\"VIN_SYS_5V0\"} 5",
            "tern_jetson_temperature_celsius{zone=\"GPU-therm\"} 48.5",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(out.contains("nv_gpu_power_usage{gpu_uuid=\"jetson-igpu\"} 19.968"));
    }

    /// AGX Xavier on JetPack 5 (L4T r35): `17000000.gv11b`, load under
    /// `gpu.0`, the hwmon INA3221 driver with Xavier's rail names (GPU, CPU,
    /// SOC on 1-0040; CV, VDDRQ, SYS5V on 1-0041).
    #[test]
    fn xavier_jetpack5() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        devfreq(
            root,
            "17000000.gv11b",
            "17000000.gv11b",
            114_750_000,
            1_377_000_000,
            None,
        );
        put(root, "sys/devices/17000000.gv11b/of_node/name", "gv11b");
        put(root, "sys/devices/gpu.0/load", "0");
        hwmon(
            root,
            "1-0040",
            2,
            &[
                (1, "GPU", 19_000, 500),
                (2, "CPU", 19_000, 32),
                (3, "SOC", 19_000, 154),
            ],
        );
        hwmon(
            root,
            "1-0041",
            3,
            &[
                (1, "CV", 19_000, 0),
                (2, "VDDRQ", 19_000, 16),
                (3, "SYS5V", 4_900, 600),
            ],
        );
        zones(
            root,
            &[
                ("AO-therm", 30_000),
                ("GPU-therm", 30_500),
                ("PMIC-Die", 100_000),
                // A repeated type keeps its own series.
                ("GPU-therm", 31_000),
            ],
        );
        meminfo(root);
        let j = Jetson::detect(root).expect("a Jetson layout");
        assert!(
            j.describe().starts_with(
                "Xavier (JetPack 5 layout), 6 power rails (ina3221 hwmon), 4 thermal zones"
            ),
            "{}",
            j.describe()
        );
        let out = render_from(root);
        for line in [
            "nv_gpu_utilization{gpu_uuid=\"jetson-igpu\"} 0",
            "nv_gpu_power_usage{gpu_uuid=\"jetson-igpu\"} 9.5",
            "tern_jetson_gpu_frequency_hz{gpu_uuid=\"jetson-igpu\"} 114750000",
            "tern_jetson_power_rail_watts{rail=\"CV\"} 0",
            "tern_jetson_temperature_celsius{zone=\"GPU-therm\"} 30.5",
            "tern_jetson_temperature_celsius{zone=\"GPU-therm_3\"} 31",
            "tern_jetson_temperature_celsius{zone=\"PMIC-Die\"} 100",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }

    /// Xavier and TX2 on JetPack 4 (L4T r32): NVIDIA's `ina3221x` iio driver,
    /// which reports power itself.
    #[test]
    fn iio_power_monitor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        devfreq(
            root,
            "17000000.gv11b",
            "17000000.gv11b",
            1_377_000_000,
            1_377_000_000,
            Some(250),
        );
        let iio = "sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0";
        for (n, name, mv, ma, mw) in [(0, "GPU", 19_000, 100, 1_900), (1, "CPU", 19_000, 50, 950)] {
            put(root, &format!("{iio}/rail_name_{n}"), name);
            put(root, &format!("{iio}/in_voltage{n}_input"), &mv.to_string());
            put(root, &format!("{iio}/in_current{n}_input"), &ma.to_string());
            put(root, &format!("{iio}/in_power{n}_input"), &mw.to_string());
        }
        let j = Jetson::detect(root).expect("a Jetson layout");
        assert!(
            j.describe().contains("2 power rails (ina3221x iio)"),
            "{}",
            j.describe()
        );
        let out = render_from(root);
        for line in [
            "nv_gpu_utilization{gpu_uuid=\"jetson-igpu\"} 0.25",
            "nv_gpu_power_usage{gpu_uuid=\"jetson-igpu\"} 1.9",
            "tern_jetson_power_rail_watts{rail=\"CPU\"} 0.95",
            "tern_jetson_power_rail_amps{rail=\"GPU\"} 0.1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }

    /// Orin NX / Nano: no GPU-only rail, so the combined CPU+GPU+CV rail
    /// carries `nv_gpu_power_usage`.
    #[test]
    fn combined_gpu_rail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        orin_jp6(root);
        fs::remove_dir_all(root.join("sys/bus/i2c/drivers/ina3221")).expect("rm");
        hwmon(
            root,
            "1-0040",
            1,
            &[
                (1, "VDD_IN", 5000, 1000),
                (2, "VDD_CPU_GPU_CV", 5000, 400),
                (3, "VDD_SOC", 5000, 300),
            ],
        );
        let out = render_from(root);
        assert!(
            out.contains("nv_gpu_power_usage{gpu_uuid=\"jetson-igpu\"} 2\n"),
            "{out}"
        );
    }

    #[test]
    fn missing_and_unreadable_files_leave_samples_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        orin_jp6(root);
        // No load, no meminfo, a rail without its current, a zone that fails
        // to read (a folder where the file should be) and garbage in max_freq.
        fs::remove_file(root.join("sys/devices/platform/bus@0/17000000.gpu/load")).expect("rm");
        fs::remove_file(root.join("proc/meminfo")).expect("rm");
        fs::remove_file(root.join("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/curr1_input"))
            .expect("rm");
        let temp = root.join("sys/devices/virtual/thermal/thermal_zone1/temp");
        fs::remove_file(&temp).expect("rm");
        fs::create_dir(&temp).expect("mkdir");
        fs::write(
            root.join("sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/max_freq"),
            "n/a\n",
        )
        .expect("write");
        let out = render_from(root);
        for gone in [
            "nv_gpu_utilization",
            "nv_gpu_memory_total_bytes",
            "nv_gpu_memory_used_bytes",
            // The GPU rail has no power without its current.
            "nv_gpu_power_usage",
            "tern_jetson_gpu_max_frequency_hz",
            "tern_jetson_power_rail_amps{rail=\"VDD_GPU_SOC\"}",
            "tern_jetson_power_rail_watts{rail=\"VDD_GPU_SOC\"}",
            "zone=\"gpu-thermal\"",
        ] {
            assert!(!out.contains(gone), "{gone} in\n{out}");
        }
        for kept in [
            "tern_jetson_gpu_frequency_hz{gpu_uuid=\"jetson-igpu\"} 306000000",
            "tern_jetson_power_rail_volts{rail=\"VDD_GPU_SOC\"} 5.008",
            "tern_jetson_power_rail_volts{rail=\"VDD_CPU_CV\"} 5.016",
            "tern_jetson_temperature_celsius{zone=\"cpu-thermal\"} 45.593",
        ] {
            assert!(out.lines().any(|l| l == kept), "{kept} missing from\n{out}");
        }
        assert!(out.contains("tern_jetson_power_rail_watts{rail=\"VDD_CPU_CV\"} "));
    }

    #[test]
    fn everything_removed_after_detection_renders_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        orin_jp6(dir.path());
        let j = Jetson::detect(dir.path()).expect("a Jetson layout");
        fs::remove_dir_all(dir.path().join("sys")).expect("rm");
        fs::remove_dir_all(dir.path().join("proc")).expect("rm");
        let mut out = String::new();
        j.render(&mut out);
        assert_eq!(out, "");
    }

    #[test]
    fn no_jetson_on_a_plain_machine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        zones(root, &[("x86_pkg_temp", 40_000)]);
        meminfo(root);
        // A devfreq node that is not a Jetson GPU.
        let other = root.join("sys/class/devfreq/dmc");
        fs::create_dir_all(&other).expect("mkdir");
        assert!(Jetson::detect(root).is_none());
        assert!(Jetson::detect(&root.join("absent")).is_none());
        // A Rockchip board's Mali GPU: a devfreq node named `*.gpu`, not a Tegra.
        devfreq(root, "platform/fb000000.gpu", "fb000000.gpu", 1, 2, Some(5));
        put(
            root,
            "sys/firmware/devicetree/base/compatible",
            "rockchip,rk3588-evb1-v10\0rockchip,rk3588",
        );
        assert!(Jetson::detect(root).is_none());
    }
}
