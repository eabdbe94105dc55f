"""sha1 of the SASS (cuobjdump, addresses and encodings stripped) of every plain and counting cubin of the given sources, over
tests/kernels/test_compile.py's families: PYTHONPATH=. python3 results/h100/issue21/scripts/sass_hashes.py flash_tma.cu ... (cuobjdump at
/tmp/cuobj/nvidia/cu13/bin, nvdisasm on PATH; run before and after a change and diff)."""
import hashlib, os, re, subprocess, sys, tempfile
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, ".")
from tests.kernels.test_compile import merged
from iokernels.kernels.nvrtc import compile_to_cubin
from iokernels.kernels.sources import build_source

def one(item):
    (source, defines, arch), instances = item
    out = []
    for counting in (False, True):
        r = compile_to_cubin(build_source(source, dict(defines), counting), arch=arch, name=source, name_expressions=instances)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(r.cubin); f.flush()
            sass = subprocess.run(["/tmp/cuobj/nvidia/cu13/bin/cuobjdump", "-sass", f.name], capture_output=True,
                                  text=True, check=True).stdout
        body = "\n".join(re.sub(r"/\*.*?\*/", "", ln).strip() for ln in sass.splitlines()
                         if re.search(r"/\*[0-9a-f]{4}\*/", ln))
        out.append(f"{source} {arch} {counting} {sorted(defines)} {hashlib.sha1(body.encode()).hexdigest()}")
    return out

if __name__ == "__main__":
    srcs = set(sys.argv[1:])
    items = [(k, v) for k, v in merged().items() if k[0] in srcs]
    with ProcessPoolExecutor(8) as ex:
        for lines in ex.map(one, items):
            print("\n".join(lines))
