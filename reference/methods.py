"""Names of the verification methods and their integer codes in a batch."""

from enum import IntEnum


class Method(IntEnum):
    """Per-request verification method. Temperature 0 makes any lossless method greedy."""

    STANDARD = 0  # Leviathan et al. 2023 / Chen et al. 2023
    STRICT = 1  # target samples y ~ target; accept iff y == draft
    BLOCK = 2  # Sun et al. 2024, block verification
    SYNTHETIC = 3  # lossy: forced conditional acceptance rates
    TYPICAL = 4  # lossy: Medusa's typical acceptance as vLLM V0 has it (reference.typical)
    FLY = 5  # lossy: FLy's entropy-gated deferred rejections as vLLM 0.33.0 has them (reference.fly)

    @classmethod
    def parse(cls, name: str) -> "Method":
        try:
            return cls[name.upper()]
        except KeyError:
            known = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"method: unknown method {name!r} (known: {known})") from None

    @property
    def lossless(self) -> bool:
        return self not in (Method.SYNTHETIC, Method.TYPICAL, Method.FLY)
