"""NVLink counters on Blackwell (NVLink5): the NVML_FI_DEV_NVLINK_COUNT_* field values where the
legacy calls answer NOT_SUPPORTED, the legacy path on Hopper, and a GPU that supports neither.

The real nvidia-ml-py module with only the library's entry points replaced (``StubPynvml`` of
tests/sources/test_nvlink.py: pynvml's own constants, error class and ``c_nvmlFieldValue_t``).  What each
stub GPU answers follows nvml.h (NVIDIA/go-nvml gen/nvml/nvml.h, NVML API 13):

* NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES/RCV_BYTES (202/204) "Total Tx/Rx bytes on the link in
  NVLink5", the COUNT error fields 206-221 "Link ID needs to be specified in the scopeId field";
* NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/RECOVERY/CRC "This is unsupported for Blackwell+. Please use
  NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*": a Blackwell answers NOT_SUPPORTED to the legacy error
  field ids and to nvmlDeviceGetNvLinkErrorCounter;
* NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (138/139) count KiB, scopeId = link.
"""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from fabricmon.agent.poller import Poller
from fabricmon.sources.nvml.backend import NVLINK5_ERROR_TYPES
from fabricmon.sources.nvml.backend_fake import FakeNvmlBackend
from fabricmon.sources.nvml.backend_pynvml import PynvmlBackend
from fabricmon.sources.nvml.source import NvmlSource
from support.nvmlstub import StubPynvml, no_inventory, series, source_status, val

_NS = pynvml.NVML_ERROR_NOT_SUPPORTED
_COUNT_FIELDS = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_FI_DEV_NVLINK_COUNT_")}
_N5_FIELD = {  # the field each NVLink5 error type must come from
    "recovery": pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS,
    "recovery_failed": pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
    "rx_errors": pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS,
    "rx_malformed": pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS,
    "rx_buffer_overrun": pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS,
    "local_link_integrity": pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS,
    "effective": pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS,
    "symbol": pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS,
}
_TPUT = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)


class GenerationStub(StubPynvml):
    """Each GPU answers like one generation:

    * ``hopper``: the legacy path (StubPynvml's answers); every COUNT field NOT_SUPPORTED;
    * ``blackwell``: COUNT fields answer, throughput fields too; legacy error ids and calls NOT_SUPPORTED;
    * ``blackwell_no_tput``: as blackwell, but the throughput fields NOT_SUPPORTED too (traffic from
      COUNT_XMIT/RCV_BYTES, in bytes);
    * ``none``: every NVLink counter NOT_SUPPORTED on both paths (link count and state still answer);
    * ``hopper_old_driver``: a Hopper whose driver predates the COUNT field ids (an nvml.h ending at
      NVML_FI_MAX 173): those answer INVALID_ARGUMENT, the legacy path works.
    """

    def __init__(self, modes: list[str], links: int = 18) -> None:
        super().__init__(gpus=len(modes), links=links)
        self.modes = modes
        self.transient: set[int] = set()  # GPUs whose COUNT fields answer NVML_ERROR_UNKNOWN this poll

    @staticmethod
    def count_value(gpu: int, link: int, fid: int) -> int:
        return 1_000 * (fid - 200) + 10 * link + gpu

    def nvmlDeviceGetFieldValues(self, h: int, field_ids: list) -> list:
        out = super().nvmlDeviceGetFieldValues(h, field_ids)
        gpu = h - 0x1000
        mode = self.modes[gpu]
        for fv in out:
            fid, link = fv.fieldId, fv.scopeId
            if fid == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT or fid == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
                continue
            legacy_err = fid in self.err_fields
            if fid in _COUNT_FIELDS:
                if mode.startswith("blackwell") and gpu in self.transient:
                    fv.nvmlReturn = pynvml.NVML_ERROR_UNKNOWN
                elif mode.startswith("blackwell"):
                    fv.nvmlReturn = pynvml.NVML_SUCCESS
                    fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                    fv.value.ullVal = self.count_value(gpu, link, fid)
                elif mode == "hopper_old_driver":
                    fv.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
                else:
                    fv.nvmlReturn = _NS
            elif (fid in _TPUT and mode in ("blackwell_no_tput", "none")) or (
                    legacy_err and not mode.startswith("hopper")):
                fv.nvmlReturn = _NS
        return out

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        if not self.modes[h - 0x1000].startswith("hopper"):
            self._count("nvmlDeviceGetNvLinkErrorCounter")
            raise pynvml.NVMLError(_NS)
        return super().nvmlDeviceGetNvLinkErrorCounter(h, link, counter)


def poll_twice(nv: GenerationStub):
    src = NvmlSource(PynvmlBackend(module=nv), timeout=5.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        first = poller.poll_once()
        nv.field_calls.clear()
        calls = nv.calls["nvmlDeviceGetNvLinkErrorCounter"]
        second = poller.poll_once()
    finally:
        poller.close()
    return first, second, nv.calls["nvmlDeviceGetNvLinkErrorCounter"] - calls


def path_of(ser: dict, gpu: str, group: str) -> list[str]:
    return sorted(dict(k[1])["path"] for k, v in ser.items()
                  if k[0] == "fabricmon_nvlink_nvml_path" and ("gpu", gpu) in k[1]
                  and ("counters", group) in k[1] and v == 1)


def info_label(ser: dict, gpu: str) -> str:
    (key,) = [k for k in ser if k[0] == "fabricmon_gpu_info" and ("gpu", gpu) in k[1]]
    return dict(key[1])["nvlink_counters"]


def link_series(ser: dict, family: str, gpu: str) -> dict[tuple[str, str], float]:
    out = {}
    for (name, labels), v in ser.items():
        lab = dict(labels)
        if name == family and lab.get("gpu") == gpu:
            out[(lab["link"], lab.get("type", ""))] = v
    return out


def test_blackwell_legacy_not_supported_reads_nvlink5_count_fields() -> None:
    nv = GenerationStub(["blackwell"])
    first, snap, counter_calls = poll_twice(nv)
    for s in (first, snap):
        st = source_status(s)
        assert st.up and st.errors_total == 0, st.last_messages
    ser = series(snap)
    assert info_label(ser, "0") == "count_fields"
    assert path_of(ser, "0", "errors") == ["count_fields"]
    assert path_of(ser, "0", "traffic") == ["throughput_fields"]
    assert val(ser, "fabricmon_nvlink_nvml_path", gpu="0", counters="errors", path="none") == 0
    errs = link_series(ser, "fabricmon_nvlink_errors_total", "0")
    # 18 links x the 8 NVLink5 types, each from its own field and link (scopeId), none of the legacy types.
    assert len(errs) == 18 * len(NVLINK5_ERROR_TYPES)
    for link in range(18):
        for etype, fid in _N5_FIELD.items():
            assert errs[(str(link), etype)] == GenerationStub.count_value(0, link, fid)
        for legacy in ("replay", "crc_flit", "crc_data"):
            assert (str(link), legacy) not in errs
        # Traffic from the throughput fields: KiB, exported as bytes.
        assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu="0", link=str(link)) == \
            (1_000_000 + link) * 1024
    # Decided once: the second poll asks one batch with only the live paths' fields, no legacy call.
    assert [g for g, _ in nv.field_calls] == [0]
    batch = nv.field_calls[0][1]
    fids = {f[0] if isinstance(f, tuple) else f for f in batch}
    assert fids & set(nv.err_fields) == set()
    assert pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES not in fids
    assert (pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, 17) in batch
    assert counter_calls == 0


def test_blackwell_without_throughput_fields_counts_bytes_not_kib() -> None:
    nv = GenerationStub(["blackwell_no_tput"], links=4)
    _, snap, _ = poll_twice(nv)
    ser = series(snap)
    assert path_of(ser, "0", "traffic") == ["count_fields"]
    for link in range(4):
        # COUNT_XMIT/RCV_BYTES are bytes (nvml.h "Total Tx bytes"): exported as read, never x1024.
        assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu="0", link=str(link)) == \
            GenerationStub.count_value(0, link, pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES)
        assert val(ser, "fabricmon_nvlink_receive_bytes_total", gpu="0", link=str(link)) == \
            GenerationStub.count_value(0, link, pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES)


def test_gpu_supporting_neither_path_says_so() -> None:
    nv = GenerationStub(["none"])
    _, snap, counter_calls = poll_twice(nv)
    ser = series(snap)
    st = source_status(snap)
    assert st.up and st.errors_total == 0  # NOT_SUPPORTED is not an error, but it is not silent:
    assert info_label(ser, "0") == "none"
    assert path_of(ser, "0", "errors") == ["none"] and path_of(ser, "0", "traffic") == ["none"]
    assert not link_series(ser, "fabricmon_nvlink_errors_total", "0")
    assert not link_series(ser, "fabricmon_nvlink_transmit_bytes_total", "0")
    assert val(ser, "fabricmon_nvlink_up", gpu="0", link="17") == 1  # the links themselves are still seen
    # Neither path is asked again: the batch holds no NVLink counter field, no legacy call is repeated.
    (batch,) = [b for _, b in nv.field_calls]
    assert batch == [pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER]
    assert counter_calls == 0
    assert snap.facts["gpus"][0]["nvlink_counters"] == "none"


def test_mixed_node_each_gpu_on_its_own_path() -> None:
    nv = GenerationStub(["hopper", "blackwell", "blackwell_no_tput", "none"], links=14)
    _, snap, counter_calls = poll_twice(nv)
    ser = series(snap)
    assert source_status(snap).errors_total == 0
    assert [info_label(ser, g) for g in "0123"] == ["legacy", "count_fields", "count_fields", "none"]
    assert [path_of(ser, g, "traffic") for g in "0123"] == \
        [["throughput_fields"], ["throughput_fields"], ["count_fields"], ["none"]]
    hopper = link_series(ser, "fabricmon_nvlink_errors_total", "0")
    assert hopper[("3", "replay")] == StubPynvml.err_value(0, 3, "REPLAY")
    assert hopper[("13", "crc_flit")] == StubPynvml.err_value(0, 13, "CRC_FLIT")  # link 13: the per-link call
    assert ("3", "rx_errors") not in hopper
    blackwell = link_series(ser, "fabricmon_nvlink_errors_total", "1")
    assert blackwell[("13", "recovery")] == GenerationStub.count_value(
        1, 13, pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS)
    assert ("13", "replay") not in blackwell
    # Only the Hopper makes per-link legacy calls: links 12, 13 x replay, recovery, crc_flit.
    assert counter_calls == 2 * 3


def test_driver_older_than_the_count_fields_stays_on_the_legacy_path() -> None:
    nv = GenerationStub(["hopper_old_driver"])
    first, snap, counter_calls = poll_twice(nv)
    for s in (first, snap):
        assert source_status(s).errors_total == 0, source_status(s).last_messages  # no error every poll
    ser = series(snap)
    assert info_label(ser, "0") == "legacy" and path_of(ser, "0", "traffic") == ["throughput_fields"]
    errs = link_series(ser, "fabricmon_nvlink_errors_total", "0")
    assert errs[("17", "replay")] == StubPynvml.err_value(0, 17, "REPLAY")  # links 12-17: the per-link calls
    assert counter_calls == 6 * 3
    fids = {f[0] if isinstance(f, tuple) else f for f in nv.field_calls[0][1]}
    assert not fids & set(_COUNT_FIELDS)  # unknown to this driver: not asked again


def test_transient_error_leaves_the_path_unknown_then_decides() -> None:
    nv = GenerationStub(["blackwell"], links=2)
    nv.transient.add(0)
    src = NvmlSource(PynvmlBackend(module=nv), timeout=5.0)
    poller = Poller("node-000", [src], no_inventory)
    try:
        first = series(poller.poll_once())
        nv.transient.clear()
        second = series(poller.poll_once())
    finally:
        poller.close()
    # An NVML_ERROR_UNKNOWN hides whether the COUNT fields are supported: no verdict, no legacy fallback.
    assert info_label(first, "0") == "unknown" and path_of(first, "0", "errors") == []
    assert not link_series(first, "fabricmon_nvlink_errors_total", "0")
    assert info_label(second, "0") == "count_fields"
    assert len(link_series(second, "fabricmon_nvlink_errors_total", "0")) == 2 * len(NVLINK5_ERROR_TYPES)


# --------------------------------------------------------------------------- the fake NVML file


def _fake_gpu(index: int, links: list[dict], **extra) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA B200", "pci_bus_id": f"0000:{index:02x}:00.0",
            "links": links, **extra}


def test_fake_file_expresses_each_path(tmp_path: Path) -> None:
    n5 = {t: i + 1 for i, t in enumerate(NVLINK5_ERROR_TYPES)}
    doc = {"gpus": [
        _fake_gpu(0, [{"state": 1, "tx_kib": 5, "rx_kib": 6, "replay": 1, "recovery": 2, "crc_flit": 3,
                       "crc_data": 4}]),  # no key: legacy, as every older fake file
        _fake_gpu(1, [{"state": 1, "tx_kib": 5, "rx_kib": 6, "replay": 9, **n5}], nvlink_counters="nvlink5"),
        _fake_gpu(2, [{"state": 1, "tx_bytes": 7, "rx_bytes": 8, **n5}],
                  nvlink_counters={"traffic": "count_fields", "errors": "count_fields"}),
        _fake_gpu(3, [{"state": 1, "tx_kib": 5, "replay": 1}], nvlink_counters="none"),
        _fake_gpu(4, [{"state": 1}], nvlink_counters="hopper"),  # not a path: refused, counted, default kept
    ]}
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(doc))
    poller = Poller("node-000", [NvmlSource(FakeNvmlBackend(path), timeout=5.0)], no_inventory)
    try:
        snap = poller.poll_once()
    finally:
        poller.close()
    ser = series(snap)
    assert [info_label(ser, g) for g in "01234"] == ["legacy", "count_fields", "count_fields", "none", "legacy"]
    assert link_series(ser, "fabricmon_nvlink_errors_total", "0") == \
        {("0", "replay"): 1, ("0", "recovery"): 2, ("0", "crc_flit"): 3, ("0", "crc_data"): 4}
    assert link_series(ser, "fabricmon_nvlink_errors_total", "1") == {("0", t): n5[t] for t in NVLINK5_ERROR_TYPES}
    assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu="1", link="0") == 5 * 1024
    assert val(ser, "fabricmon_nvlink_transmit_bytes_total", gpu="2", link="0") == 7
    assert val(ser, "fabricmon_nvlink_receive_bytes_total", gpu="2", link="0") == 8
    assert not link_series(ser, "fabricmon_nvlink_errors_total", "3")
    assert path_of(ser, "3", "traffic") == ["none"]
    st = source_status(snap)
    assert st.errors_total == 1 and "nvlink_counters" in st.last_messages[-1]
    assert val(ser, "fabricmon_source_values_rejected_total", collector="nvml", reason="malformed") == 1


@pytest.mark.parametrize("bad", [{"errors": "throughput_fields"}, {"traffic": "legacy"}, 7])
def test_fake_file_refuses_impossible_paths(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [_fake_gpu(0, [{"state": 1}], nvlink_counters=bad)]}))
    be = FakeNvmlBackend(path)
    be.init()
    be.begin_poll()
    g = be.read_gpu(0)
    assert g.rejected == ["malformed"] and "nvlink_counters" in g.problems[0]


def test_capture_of_a_blackwell_replays_through_the_fake_file(tmp_path: Path) -> None:
    """`fabricmon agent --once --capture` writes NVML readings as a fake-NVML file (collect.gpu_document):
    the NVLink5 paths and counters must come back the same from it."""
    from fabricmon.collect import gpu_document

    nv = GenerationStub(["blackwell_no_tput", "hopper", "none"], links=3)
    be = PynvmlBackend(module=nv)
    be.init()
    be.begin_poll()
    real = [be.read_gpu(i) for i in range(3)]
    be.shutdown()
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [gpu_document(g) for g in real]}))
    fake = FakeNvmlBackend(path)
    fake.init()
    fake.begin_poll()
    for g in real:
        f = fake.read_gpu(g.index)
        assert (f.traffic_path, f.errors_path) == (g.traffic_path, g.errors_path)
        for a, b in zip(f.links, g.links, strict=True):
            assert (a.tx_kib, a.tx_bytes, a.rx_bytes, a.replay, a.crc_flit, a.nvlink5_errors) == \
                (b.tx_kib, b.tx_bytes, b.rx_bytes, b.replay, b.crc_flit, b.nvlink5_errors)
    assert real[0].links[2].nvlink5_errors["symbol"] > 0 and real[0].links[2].tx_bytes > 0
