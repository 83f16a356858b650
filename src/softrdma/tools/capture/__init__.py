"""Capture analysis: pcap-check, pcap conversion, ladder diagrams."""
