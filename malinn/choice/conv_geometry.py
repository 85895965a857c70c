"""The geometry of one convolution layer as a plan runs it (what the tuning database keys conv winners by)."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ConvGeometry"]


@dataclass(frozen=True)
class ConvGeometry:
    """One convolution layer as a plan runs it: batch, channels, groups and the window defines."""

    batch: int
    cin: int
    cout: int
    groups: int
    IH: int
    IW: int
    OH: int
    OW: int
    KH: int
    KW: int
    SH: int
    SW: int
    DH: int
    DW: int
    PT: int
    PL: int

    @classmethod
    def of(cls, batch: int, cin: int, cout: int, groups: int, window: dict) -> "ConvGeometry":
        """From the window defines of :func:`malinn.layers.windows.window_defines`."""
        return cls(int(batch), int(cin), int(cout), int(groups), *(int(window[f.name]) for f in fields(cls)[4:]))

    def window_defines(self) -> dict:
        """The window defines (``IH`` ... ``PL``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)[4:]}

    def defines(self) -> dict:
        """What a ``conv`` kernel is configured with for this layer: the window, ``CG`` and ``MG``
        (input and output channels per group) and ``GROUPS``."""
        return {**self.window_defines(), "CG": self.cg, "MG": self.cout // self.groups, "GROUPS": self.groups}

    @property
    def cg(self) -> int:
        return self.cin // self.groups

    @property
    def taps(self) -> int:
        return self.KH * self.KW

    @property
    def pixels(self) -> int:
        return self.batch * self.OH * self.OW

    def product(self) -> tuple:
        """``(m, k, n)`` of the GEMM it amounts to: ``COUT x KH*KW*CG x batch*OH*OW``."""
        return self.cout, self.taps * self.cg, self.pixels

    def measures(self) -> dict:
        """The quantities a rule's conditions bound."""
        return {
            "cg": self.cg,
            "cout": self.cout,
            "taps": self.taps,
            "pixels": self.pixels,
            "image": self.OH * self.OW,
            "stride": max(self.SH, self.SW),
            "batch": self.batch,
        }

    def key(self) -> str:
        """The tuning database's name: ``b8-c96-m256-g1-i27x27-o27x27-k5x5-s1x1-d1x1-p2x2``."""
        return (
            f"b{self.batch}-c{self.cin}-m{self.cout}-g{self.groups}-i{self.IH}x{self.IW}-o{self.OH}x{self.OW}"
            f"-k{self.KH}x{self.KW}-s{self.SH}x{self.SW}-d{self.DH}x{self.DW}-p{self.PT}x{self.PL}"
        )

    @classmethod
    def parse(cls, text: str) -> "ConvGeometry":
        """The geometry :meth:`key` named.

        Raises:
            ValueError: ``text`` is not such a name.
        """
        try:
            parts = dict((p[0], p[1:]) for p in text.split("-"))
            pairs = [tuple(int(v) for v in parts[c].split("x")) for c in "iokdsp"]
            if any(len(p) != 2 for p in pairs):
                raise ValueError
            (ih, iw), (oh, ow), (kh, kw), (dh, dw), (sh, sw), (pt, pl) = pairs
            geometry = cls(
                int(parts["b"]),
                int(parts["c"]),
                int(parts["m"]),
                int(parts["g"]),
                ih,
                iw,
                oh,
                ow,
                kh,
                kw,
                sh,
                sw,
                dh,
                dw,
                pt,
                pl,
            )
        except (KeyError, ValueError, IndexError, TypeError):
            raise ValueError(
                f"{text!r} is not a convolution geometry "
                f"(b<batch>-c<cin>-m<cout>-g<groups>-i<H>x<W>-o..-k..-s..-d..-p..)"
            ) from None
        if geometry.key() != text or min(geometry.batch, geometry.cin, geometry.cout, geometry.groups) < 1:
            raise ValueError(f"{text!r} is not a convolution geometry in its canonical form")
        return geometry
