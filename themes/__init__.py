"""Textual CSS themes shipped as package data (found by an installed wheel too)."""
