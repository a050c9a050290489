"""Models found on disk, over fake trees in the real layouts: the Hugging Face hub cache (blobs,
refs, snapshot symlinks), Ollama's manifests and blobs, LM Studio's publisher/model folders,
llama.cpp's cache, folders the user adds. Broken and half-downloaded entries are rows that say why."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
from model_files import save_hf_folder, tiny_hf, write_gguf

from engine.hardware.ceilings import Chip, fit_on
from engine.io.discovery import add_user_folder, discover, row_cells, scan_hf_cache, scan_ollama, user_folders
from engine.io.loader import load_model


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models (tests/conftest.py)

COMMIT = "a" * 40


def hub_repo(cache: Path, repo_id: str, files: dict[str, Path], commit: str = COMMIT) -> Path:
    """A repo as huggingface_hub leaves it: blobs named by hash, refs/main, snapshot symlinks."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        shutil.copyfile(source, blob)
        (snapshot / name).symlink_to(Path("../../blobs") / digest)
    return repo


def ollama_model(root: Path, name: str, tag: str, gguf_file: Path | None, size: int | None = None,
                 digest: str | None = None) -> Path:
    digest = digest or "sha256:" + hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    if gguf_file is not None:
        shutil.copyfile(gguf_file, root / "blobs" / digest.replace(":", "-"))
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest,
         "size": size if size is not None else gguf_file.stat().st_size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10}]}))
    return manifest


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One tiny model of each kind, made once: HF folders (one sharded), GGUF files."""
    root = tmp_path_factory.mktemp("made")
    llama = tiny_hf("llama", seed=1)
    qwen = tiny_hf("qwen2", seed=2)
    return {
        "hf": save_hf_folder(llama, root / "hf"),
        "sharded": save_hf_folder(qwen, root / "sharded", max_shard_size="40KB"),
        "llama.gguf": write_gguf(llama, root / "tiny-llama.Q8_0.gguf", qtype=gguf.GGMLQuantizationType.Q8_0,
                                 file_type=gguf.LlamaFileType.MOSTLY_Q8_0),
        "qwen.gguf": write_gguf(qwen, root / "tiny-qwen.gguf"),
    }


@pytest.fixture
def machine(tmp_path, files):
    """A home folder with every tool's store, good entries and broken ones."""
    home = tmp_path / "home"
    env = {"HF_HUB_CACHE": str(home / "hub"), "OLLAMA_MODELS": str(home / "ollama"),
           "LLAMA_CACHE": str(home / "llama-cache"), "XDG_CONFIG_HOME": str(home / "config")}
    hub = home / "hub"
    hf = files["hf"]
    hub_repo(hub, "org/tiny-llama", {p.name: p for p in hf.iterdir()})
    hub_repo(hub, "org/tiny-gguf", {"tiny-llama.Q8_0.gguf": files["llama.gguf"], "README.md": hf / "config.json"})
    sharded = sorted(files["sharded"].glob("*.safetensors"))
    half = {p.name: p for p in files["sharded"].iterdir() if p != sharded[-1]}
    repo = hub_repo(hub, "org/half-downloaded", half)
    (repo / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"\0" * 100)
    gpt2 = hf.parent / "gpt2-config.json"
    gpt2.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    hub_repo(hub, "org/gpt2", {"config.json": gpt2, "model.safetensors": next(hf.glob("*.safetensors")),
                               "tokenizer.json": hf / "tokenizer.json"})
    (hub / "models--org--broken" / "blobs").mkdir(parents=True)  # no snapshots folder: corrupt
    (hub / "datasets--org--some-data" / "snapshots").mkdir(parents=True)  # not a model: not listed

    ollama = home / "ollama"
    ollama_model(ollama, "tiny-qwen", "latest", files["qwen.gguf"])
    digest = "sha256:" + "b" * 64
    ollama_model(ollama, "pulling", "7b", None, size=10**9, digest=digest)
    (ollama / "blobs" / f"sha256-{'b' * 64}-partial").write_bytes(b"\0" * 1000)
    bad = ollama / "manifests" / "registry.ollama.ai" / "library" / "garbled" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")

    lm = home / ".lmstudio" / "models" / "publisher" / "tiny-qwen-GGUF"
    lm.mkdir(parents=True)
    shutil.copyfile(files["qwen.gguf"], lm / "tiny-qwen.F32.gguf")
    data = files["llama.gguf"].read_bytes()
    (lm / "tiny-llama.truncated.gguf").write_bytes(data[: len(data) // 2])
    (lm / "notes.gguf").write_text("not a model")
    (lm / "mmproj-model-f16.gguf").write_bytes(data)  # an image projector: not listed

    llama_cpp = home / "llama-cache"
    llama_cpp.mkdir()
    shutil.copyfile(files["llama.gguf"], llama_cpp / "org_tiny-llama_tiny-llama.Q8_0.gguf")
    return home, env


def by_name(rows):
    return {r.name: r for r in rows}


def test_every_store_is_found_and_every_broken_entry_says_why(machine):
    home, env = machine
    rows = by_name(discover(home=home, env=env, bundled=False))
    good = {name for name, r in rows.items() if r.supported}
    assert good == {"org/tiny-llama", "org/tiny-gguf/tiny-llama.Q8_0.gguf", "tiny-qwen:latest",
                    "publisher/tiny-qwen-GGUF/tiny-qwen.F32.gguf", "org_tiny-llama_tiny-llama.Q8_0.gguf"}
    assert rows["org_tiny-llama_tiny-llama.Q8_0.gguf"].source == "llama.cpp"

    llama = rows["org/tiny-llama"]
    assert (llama.source, llama.format, llama.architecture, llama.file_type) == ("hf cache", "hf", "Llama", "fp32")
    assert llama.n_params == llama.cfg.n_params == sum(p.numel() for p in tiny_hf("llama", seed=1).parameters())
    assert llama.file_bytes > 4 * llama.n_params
    q8 = rows["org/tiny-gguf/tiny-llama.Q8_0.gguf"]
    assert (q8.format, q8.architecture, q8.file_type) == ("gguf", "Llama", "Q8_0") and q8.file_bytes < llama.file_bytes
    qwen = rows["tiny-qwen:latest"]
    assert (qwen.source, qwen.architecture, qwen.file_type) == ("ollama", "Qwen2", "F32")
    assert Path(qwen.path).parent.name == "blobs" and qwen.cfg.qkv_bias

    reasons = {name: r.reason for name, r in rows.items() if not r.supported}
    assert "1 of" in reasons["org/half-downloaded"] and "weight shards missing" in reasons["org/half-downloaded"]
    assert "unsupported architecture 'GPT2LMHeadModel'" in reasons["org/gpt2"]
    assert "corrupt cache entry" in reasons["org/broken"]
    assert "pull unfinished" in reasons["pulling:7b"]
    assert "manifest is unreadable" in reasons["garbled:latest"]
    assert "truncated" in reasons["publisher/tiny-qwen-GGUF/tiny-llama.truncated.gguf"]
    assert "not a GGUF file" in reasons["publisher/tiny-qwen-GGUF/notes.gguf"]
    assert not any("mmproj" in name or "some-data" in name for name in rows)
    assert all("\n" not in r.reason for r in rows.values())


def test_found_paths_load(machine):
    home, env = machine
    rows = by_name(discover(home=home, env=env))
    hf = load_model(rows["org/tiny-llama"].path)  # the snapshot folder of symlinks
    assert hf.cfg.family == "Llama" and hf.source == "hf"
    blob = load_model(rows["tiny-qwen:latest"].path)  # an Ollama blob: a GGUF without the extension
    assert blob.cfg.family == "Qwen2" and blob.label.startswith("tiny qwen2 (Qwen2, F32 → fp32")


def test_user_folders_are_saved_and_scanned(machine, files, tmp_path):
    home, env = machine
    mine = tmp_path / "my-models"
    shutil.copytree(files["sharded"], mine / "tiny-qwen-sharded")
    assert user_folders(env, home) == []
    add_user_folder(mine, env, home)
    add_user_folder(mine, env, home)
    assert user_folders(env, home) == [mine.resolve()]
    row = by_name(discover(home=home, env=env))["tiny-qwen-sharded"]
    assert row.supported and row.source == "folder" and row.architecture == "Qwen2" and row.file_type == "fp32"
    extra = tmp_path / "elsewhere"
    extra.mkdir()
    shutil.copyfile(files["llama.gguf"], extra / "another.gguf")
    assert "another.gguf" in by_name(discover([extra], home=home, env=env))


def test_fit_and_the_seed_formula_ceiling(machine):
    home, env = machine
    rows = by_name(discover(home=home, env=env))
    llama = rows["org/tiny-gguf/tiny-llama.Q8_0.gguf"]
    cfg = llama.cfg
    read_params = cfg.n_layers * cfg.layer_linear_params + cfg.vocab_size * cfg.dim  # every matmul, the head too
    roomy = Chip("test GPU", bandwidth_gbs=1000.0, memory_bytes=10**9, source="spec")
    fit = fit_on(llama.cfg, llama.n_params, roomy, "bf16")  # a Q8_0 file runs at bf16: 2 bytes a weight
    assert fit.fits and fit.stored_bytes == cfg.n_params * 2
    # the cost model's bytes (engine/metrics.py): every matmul once, the head, and the norms
    read_bytes = read_params * 2 + cfg.vector_elems_per_step * 2
    assert fit.ceiling_tokens_per_s == pytest.approx(1000e9 / read_bytes)
    cramped = Chip("tiny GPU", bandwidth_gbs=1000.0, memory_bytes=cfg.n_params, source="spec")
    squeezed = fit_on(llama.cfg, llama.n_params, cramped, "bf16")
    assert squeezed.fits is False and squeezed.ceiling_tokens_per_s is None
    cells = row_cells(llama, fit)
    assert cells[0] == llama.name and cells[1] == "Llama" and cells[4] == "Q8_0" and cells[5] == "yes"
    assert cells[6].startswith("yes") and cells[7].startswith("≤ ") and cells[7].endswith("tok/s")
    assert row_cells(llama, squeezed)[6].startswith("no: ")
    broken = rows["org/gpt2"]
    unknown = fit_on(broken.cfg, broken.n_params, roomy, "bf16")
    assert unknown.ceiling_tokens_per_s is None and unknown.fits is None
    assert row_cells(broken, unknown)[5].startswith("no: unsupported architecture")


def test_a_missing_or_unreadable_cache_is_no_crash(tmp_path):
    assert discover(home=tmp_path / "nobody", env={}, bundled=False) == []
    assert scan_ollama(tmp_path / "no-ollama") == []
    weird = tmp_path / "hub"
    weird.write_text("a file where the cache should be")
    rows = scan_hf_cache(weird)
    assert len(rows) == 1 and not rows[0].supported


def test_discovery_imports_no_torch(machine):
    """The app lists models with it, and the app never imports torch."""
    home, env = machine
    code = ("import sys, json; from engine.io.discovery import discover; "
            f"rows = discover(home={str(home)!r}, env={env!r}); "
            "print(json.dumps([len(rows), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    n_rows, torch_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert n_rows >= 10 and torch_loaded is False


def test_a_folder_that_cannot_be_read_is_a_row_not_a_crash(tmp_path, monkeypatch):
    """Another user's store (/usr/share/ollama is 0750 on Linux): an unreadable folder, or one inside
    a folder we may not enter, is a row with the reason, or nothing, never an exception."""
    from engine.io import discovery

    locked, behind = tmp_path / "locked", tmp_path / "private" / "models"
    locked.mkdir()
    behind.mkdir(parents=True)
    real_scan, real_is_dir = discovery.scan_folder, Path.is_dir

    def scan_folder(folder, source, depth=discovery.MAX_DEPTH):
        if folder == locked:
            raise PermissionError(13, "Permission denied")
        return real_scan(folder, source, depth)

    def is_dir(path):
        if path == behind:
            raise PermissionError(13, "Permission denied")
        return real_is_dir(path)

    monkeypatch.setattr(discovery, "scan_folder", scan_folder)
    monkeypatch.setattr(Path, "is_dir", is_dir)
    rows = discover([locked, behind], home=tmp_path / "home", env={"OLLAMA_MODELS": str(tmp_path / "none")},
                    bundled=False)
    assert [(r.name, r.reason) for r in rows] == [(str(locked), "cannot read: Permission denied")]


def test_the_bundled_default_model_is_listed_first(tmp_path):
    """A machine with nothing but membound on it has the model membound ships with."""
    from engine.io.default_model import find_default_model

    rows = discover(home=tmp_path / "nobody", env={})
    assert len(rows) == 1
    row = rows[0]
    assert (row.source, row.path, row.supported) == ("bundled", str(find_default_model()), True)
    assert row.architecture == "Llama" and row.file_type == "Q4_1" and row.cfg.dim == 576
