"""Extract vLLM V0's speculative-decoding sampler files from a release's wheel into a folder
that ``vllm-v0-typical@FOLDER`` (``harness.backends.vllm.v0_typical``) and
``vllm-v0-rejection@FOLDER`` (``harness.backends.vllm.v0_rejection``) bind.

    python scripts/vllm_v0_files.py --version 0.6.3 --out vendor/vllm-0.6.3 [--wheel PATH]

Only ``vllm/__init__.py`` (never imported: it marks the folder as a vLLM tree) and
``vllm/model_executor/layers/{spec_decode_base_sampler,typical_acceptance_sampler,rejection_sampler}.py``
are written (the samplers' other imports, ``vllm.envs`` and ``vllm.logger``, are stubbed by the
adapter: they do not touch the sampling law); the wheel (~190 MB) is downloaded to a temporary folder unless ``--wheel`` names one.
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

FILES = (
    "vllm/__init__.py",
    "vllm/model_executor/layers/spec_decode_base_sampler.py",
    "vllm/model_executor/layers/typical_acceptance_sampler.py",
    "vllm/model_executor/layers/rejection_sampler.py",
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", required=True, help="a V0 release with the sampler, e.g. 0.6.3")
    p.add_argument("--out", required=True, help="the folder to write (created; its files replaced)")
    p.add_argument("--wheel", help="a downloaded wheel of that release")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel
        if wheel is None:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                f"vllm=={args.version}",
                "-d",
                tmp,
            ]
            if subprocess.run(cmd).returncode != 0:
                print(f"error: could not download vllm=={args.version}", file=sys.stderr)
                return 2
            wheel = glob.glob(os.path.join(tmp, "vllm-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            missing = [f for f in FILES if f not in names]
            if missing:
                print(f"error: {wheel} has no {missing[0]} (V0's samplers are in vLLM 0.5.x-0.6.x)", file=sys.stderr)
                return 2
            for name in FILES:
                dest = os.path.join(args.out, name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest + ".partial", "wb") as f:
                    f.write(z.read(name))
                os.replace(dest + ".partial", dest)
    print(f"wrote {len(FILES)} files under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
