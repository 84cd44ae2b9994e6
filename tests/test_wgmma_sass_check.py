"""The SASS hazard scan finds a write to an in-flight wgmma's registers, and
only that (synthetic cuobjdump output; no GPU needed)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "wgmma_sass_check", Path(__file__).parent.parent / "graph_tests" / "wgmma_sass_check.py")
sass_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_check)


def _sass(*body):
    lines = [f"        /*{16 * i:04x}*/                   {ins} ;" for i, ins in enumerate(body)]
    return "\n\t\tFunction : kernel\n" + "\n".join(lines) + "\n"


ISSUE = ("WARPGROUP.ARRIVE", "HGMMA.64x64x16.F32.BF16 R24, R152, gdesc[UR4], R24, gsb0")


def _hazards(*body):
    (_, code), = sass_check.kernels(_sass(*body))
    return sass_check.hazards(code)


def test_write_after_the_wait_is_fine():
    assert _hazards(*ISSUE, "WARPGROUP.DEPBAR.LE gsb0, 0x0", "FMUL.FTZ R24, R24, R2",
                    "F2FP.BF16.F32.PACK_AB R152, R1, R0") == []


def test_accumulator_write_in_flight_is_found():
    assert len(_hazards(*ISSUE, "FMUL.FTZ R40, R1, R2", "WARPGROUP.DEPBAR.LE gsb0, 0x0")) == 1


def test_accumulator_count_follows_the_shape():
    narrow = ("WARPGROUP.ARRIVE", "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], R24, gsb0")
    # 64 x 32 fp32 over 128 threads: R24..R39 in flight, R40 free.
    assert _hazards(*narrow, "FMUL.FTZ R40, R1, R2") == []
    assert len(_hazards(*narrow, "FMUL.FTZ R39, R1, R2")) == 1


def test_a_register_write_in_flight_is_found():
    assert len(_hazards(*ISSUE, "F2FP.BF16.F32.PACK_AB R154, R1, R0")) == 1


def test_wait_for_all_but_the_newest_group():
    second = "HGMMA.64x64x16.F32.BF16 R56, R160, gdesc[UR8].tnspB, R56, gsb0"
    # The older group (R24..R55) is retired, the newer (R56..R87) is not.
    assert _hazards(*ISSUE, second, "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FADD.FTZ R30, R30, R1") == []
    assert len(_hazards(*ISSUE, second, "WARPGROUP.DEPBAR.LE gsb0, 0x1",
                        "FADD.FTZ R60, R60, R1")) == 1


def test_no_wgmma_kernel_fails_the_scan(tmp_path, capsys):
    sass = tmp_path / "k.sass"
    sass.write_text(_sass("FMUL.FTZ R1, R2, R3"))
    assert sass_check.main(["--sass", str(sass)]) == 1
