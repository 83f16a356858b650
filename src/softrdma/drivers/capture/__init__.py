"""The drivers' capture/ room: pcap capture and packet trace of RoCE and iWARP devices.

Importing this package imports none of its modules."""
