"""A resctrl mount in the formats of Documentation/arch/x86/resctrl.rst, for FORMAT TESTS on
machines without resctrl. It is files, not a kernel: KernelLikeResctrl replays what the kernel
does on mkdir and rmdir of a group; nothing shows what the hardware does with the masks."""

from __future__ import annotations

from pathlib import Path

from sloguard.actuators.resctrl import Resctrl, parse_schemata


def resctrl_tree(root: Path, cdp: bool = False, mb: str | None = "100", cbm: str = "fffff",
                 min_bits: str = "1", domains: tuple[str, ...] = ("0", "1")) -> Path:
    """/sys/fs/resctrl as mounted on a two-socket Intel machine (CAT, optionally CDP, MBA)."""
    info = root / "info"
    info.mkdir(parents=True)
    (info / "last_cmd_status").write_text("ok\n")
    names = ["L3CODE", "L3DATA"] if cdp else ["L3"]
    lines = []
    for name in names:
        (info / name).mkdir()
        for file, value in (("cbm_mask", cbm), ("min_cbm_bits", min_bits), ("num_closids", "16"),
                            ("shareable_bits", "c0000"), ("sparse_masks", "0")):
            (info / name / file).write_text(value + "\n")
        lines.append(f"{name:>6}:" + ";".join(f"{d}={cbm}" for d in domains))
    if mb is not None:
        (info / "MB").mkdir()
        for file, value in (("min_bandwidth", "10"), ("bandwidth_gran", "10"),
                            ("num_closids", "8"), ("delay_linear", "1"),
                            ("thread_throttle_mode", "max")):
            (info / "MB" / file).write_text(value + "\n")
        lines.append(f"{'MB':>6}:" + ";".join(f"{d}={mb}" for d in domains))
    (root / "schemata").write_text("\n".join(lines) + "\n")
    (root / "tasks").write_text("1\n2\n")
    (root / "cpus").write_text("3\n")
    (root / "cpus_list").write_text("0-1\n")
    (root / "mode").write_text("shareable\n")
    return root


class KernelLikeResctrl(Resctrl):
    """mkdir and rmdir of a group as the kernel does them: a new CTRL_MON group comes with its
    files and the default (full) schemata; removing it takes its files with it."""

    fail_mkdir: int | None = None

    def _mkdir(self, path: Path) -> None:
        if self.fail_mkdir:
            raise OSError(self.fail_mkdir, "No space left on device")
        path.mkdir()
        full = parse_schemata((self.root / "schemata").read_text())
        default = []
        for name, values in full.items():
            if name == "MB":
                values = dict.fromkeys(values, "100")
            elif name.startswith("L3"):
                mask = (self.root / "info" / name / "cbm_mask").read_text().strip()
                values = dict.fromkeys(values, mask)
            default.append(f"{name}:" + ";".join(f"{d}={v}" for d, v in values.items()))
        (path / "schemata").write_text("\n".join(default) + "\n")
        for name in ("tasks", "cpus", "cpus_list", "mode", "size"):
            (path / name).write_text("shareable\n" if name == "mode" else "")

    def _rmdir(self, path: Path) -> None:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
