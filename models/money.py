"""Money: integer minor units plus a currency (CONTRACT section 3), never floats."""

from __future__ import annotations

from sqlalchemy import BigInteger, String

NGN = "NGN"
USD = "USD"
CURRENCIES = (NGN, USD)


def minor_units() -> BigInteger:
    # A large brand's campaign budget in kobo passes 2^31 quickly (₦21.5 million).
    return BigInteger()


def currency_code() -> String:
    return String(3)
