"""The xpu target's profile for accrewrite (xpu.toml beside this file)."""
