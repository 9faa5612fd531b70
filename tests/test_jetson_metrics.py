"""Jetson GPU gauges from sysfs: the built binary, pointed at a fake AGX Orin
tree laid out as on JetPack 6 (TERN_SYSFS_ROOT), exports Triton's GPU
families under gpu_uuid="jetson-igpu" and Tern's tern_jetson_* families on
/metrics, in a form perf_analyzer's metrics collection parses."""

import os
import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

UUID = "jetson-igpu"

# perf_analyzer's pattern for one GPU's sample of a family.
PERF_ANALYZER_SAMPLE = re.compile(r'\{gpu_uuid\="([^"]+)"\} (\d+\.?\d*)')


def put(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{text}\n")


def fake_orin_jp6(root):
    """AGX Orin, Jetson Linux r36: the GPU's devfreq node 17000000.gpu under
    bus@0 (its class entry a link, as in sysfs), the INA3221 hwmon driver at
    1-0040 and 1-0041, nine thermal zones, /proc/meminfo."""
    dev = "sys/devices/platform/bus@0/17000000.gpu"
    os.makedirs(os.path.join(root, "sys/firmware/devicetree/base"), exist_ok=True)
    with open(os.path.join(root, "sys/firmware/devicetree/base/compatible"), "wb") as f:
        f.write(b"nvidia,p3737-0000+p3701-0000\0nvidia,p3701-0000\0nvidia,tegra234\0")
    put(root, f"{dev}/load", "412")
    put(root, f"{dev}/of_node/name", "gpu")
    put(root, f"{dev}/devfreq/17000000.gpu/cur_freq", "918000000")
    put(root, f"{dev}/devfreq/17000000.gpu/max_freq", "1300500000")
    os.symlink(os.path.join(root, dev), os.path.join(root, dev, "devfreq/17000000.gpu/device"))
    os.makedirs(os.path.join(root, "sys/class/devfreq"))
    os.symlink(
        os.path.join(root, dev, "devfreq/17000000.gpu"),
        os.path.join(root, "sys/class/devfreq/17000000.gpu"),
    )
    rails = {
        ("1-0040", "hwmon1"): [(1, "VDD_GPU_SOC", 5000, 2000), (2, "VDD_CPU_CV", 5000, 500), (3, "VIN_SYS_5V0", 5000, 800)],
        ("1-0041", "hwmon2"): [(2, "VDDQ_VDD2_1V8AO", 5000, 250)],
    }
    for (chip, hwmon), channels in rails.items():
        d = f"sys/bus/i2c/drivers/ina3221/{chip}/hwmon/{hwmon}"
        put(root, f"{d}/name", "ina3221")
        for n, label, mv, ma in channels:
            put(root, f"{d}/in{n}_label", label)
            put(root, f"{d}/in{n}_input", mv)
            put(root, f"{d}/curr{n}_input", ma)
        put(root, f"{d}/in7_label", "sum of shunt voltages")
    zones = ["cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal",
             "soc0-thermal", "soc1-thermal", "soc2-thermal", "tj-thermal"]
    for i, kind in enumerate(zones):
        put(root, f"sys/class/thermal/thermal_zone{i}/type", kind)
        put(root, f"sys/class/thermal/thermal_zone{i}/temp", 40000 + 250 * i)
    put(root, "proc/meminfo", "MemTotal:       32000000 kB\nMemFree:        1000 kB\nMemAvailable:   24000000 kB")


def scrape(t):
    with urllib.request.urlopen(f"http://{t.metrics_url}/metrics", timeout=10) as r:
        return r.read().decode()


def samples(text, name):
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert name in fams, f"{name} not on the page:\n{text}"
    return {tuple(sorted(s.labels.items())): s.value for s in fams[name].samples}


@pytest.fixture
def orin(tmp_path, start_tern):
    root = str(tmp_path / "root")
    fake_orin_jp6(root)
    repo = tmp_path / "models"
    repo.mkdir()
    t = start_tern([f"--model-repository={repo}"], env={"TERN_SYSFS_ROOT": root})
    text = scrape(t)
    if any(
        dict(labels).get("gpu_uuid") != UUID
        for labels in samples(text, "nv_gpu_utilization")
    ):
        # NVML sees a GPU here, and then the Jetson gauges are (rightly) not
        # read: the build without the cuda feature has no NVML and reads them.
        minimal = os.environ.get("TERN_MINIMAL_BIN")
        if not minimal:
            pytest.fail("NVML sees a GPU and TERN_MINIMAL_BIN is not set (`make flavours` builds it)")
        t.stop()
        t = start_tern([f"--model-repository={repo}"], env={"TERN_SYSFS_ROOT": root}, binary=minimal)
        text = scrape(t)
    return t, root, text


def test_startup_log_says_what_was_found(orin):
    t, _, _ = orin
    assert t.wait_log(
        "Jetson GPU metrics from sysfs: Orin (JetPack 6 layout), 4 power rails (ina3221 hwmon), "
        "9 thermal zones, GPU load readable"
    ), t.log()


def test_tritons_gpu_families_come_from_sysfs(orin):
    _, _, text = orin
    gpu = (("gpu_uuid", UUID),)
    assert samples(text, "nv_gpu_utilization") == {gpu: 0.412}
    assert samples(text, "nv_gpu_memory_total_bytes") == {gpu: 32000000 * 1024}
    assert samples(text, "nv_gpu_memory_used_bytes") == {gpu: 8000000 * 1024}
    # The VDD_GPU_SOC rail: 5 V x 2 A.
    assert samples(text, "nv_gpu_power_usage") == {gpu: 10.0}
    assert "nv_gpu_power_limit" not in text and "nv_energy_consumption" not in text


def test_tern_jetson_families(orin):
    _, _, text = orin
    gpu = (("gpu_uuid", UUID),)
    assert samples(text, "tern_jetson_gpu_frequency_hz") == {gpu: 918e6}
    assert samples(text, "tern_jetson_gpu_max_frequency_hz") == {gpu: 1300.5e6}
    watts = samples(text, "tern_jetson_power_rail_watts")
    assert watts == {
        (("rail", "VDD_GPU_SOC"),): 10.0,
        (("rail", "VDD_CPU_CV"),): 2.5,
        (("rail", "VIN_SYS_5V0"),): 4.0,
        (("rail", "VDDQ_VDD2_1V8AO"),): 1.25,
    }
    assert samples(text, "tern_jetson_power_rail_volts")[(("rail", "VIN_SYS_5V0"),)] == 5.0
    assert samples(text, "tern_jetson_power_rail_amps")[(("rail", "VIN_SYS_5V0"),)] == 0.8
    temps = samples(text, "tern_jetson_temperature_celsius")
    assert len(temps) == 9
    assert temps[(("zone", "gpu-thermal"),)] == 40.25
    assert temps[(("zone", "tj-thermal"),)] == 42.0
    # debugfs (the EMC clock) is not in the tree: no sample, no error.
    assert "tern_jetson_emc_frequency_hz" not in text


def test_perf_analyzer_parses_the_page(orin):
    _, _, text = orin
    for family in ("nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"):
        lines = [line for line in text.splitlines() if line.startswith(family + "{")]
        assert len(lines) == 1, lines
        m = PERF_ANALYZER_SAMPLE.search(lines[0])
        assert m and m.group(1) == UUID, lines[0]
        assert float(m.group(2)) == float(lines[0].rsplit(" ", 1)[1])


def test_files_that_vanish_leave_their_samples_out(orin):
    t, root, _ = orin
    os.remove(os.path.join(root, "sys/devices/platform/bus@0/17000000.gpu/load"))
    os.remove(os.path.join(root, "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1/curr1_input"))
    os.remove(os.path.join(root, "proc/meminfo"))
    text = scrape(t)
    for gone in ("nv_gpu_utilization", "nv_gpu_power_usage", "nv_gpu_memory_used_bytes"):
        assert gone not in text, text
    assert samples(text, "tern_jetson_power_rail_watts")[(("rail", "VDD_CPU_CV"),)] == 2.5
    assert (("rail", "VDD_GPU_SOC"),) not in samples(text, "tern_jetson_power_rail_watts")
    # The rest of the page is still there.
    assert "nv_cpu_utilization" in text


def test_no_jetson_gauges_without_a_jetson_tree(tmp_path, start_tern):
    repo = tmp_path / "models"
    repo.mkdir()
    t = start_tern([f"--model-repository={repo}"], env={"TERN_SYSFS_ROOT": str(tmp_path / "nothing")})
    text = scrape(t)
    assert "tern_jetson_" not in text
    assert f'gpu_uuid="{UUID}"' not in text
    assert "Jetson GPU metrics from sysfs" not in t.log()
