#!/usr/bin/env python3
# embed_text: writes a C file that holds a text file's bytes as an array, so
# that the server carries its page (server/dashboard.html) in the binary.
# Usage: embed_text.py INPUT OUTPUT.c NAME
import sys

src, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
data = open(src, 'rb').read()
with open(out, 'w') as f:
    f.write('// Generated from %s by server/embed_text.py: do not edit.\n' % src.split('/')[-1])
    f.write('#include <stddef.h>\n\n')
    f.write('const char %s[] = {\n' % name)
    for i in range(0, len(data), 16):
        f.write('    ' + ', '.join('0x%02x' % b for b in data[i:i + 16]) + ',\n')
    f.write('    0x00,\n};\n')
    f.write('const size_t %s_len = %d;\n' % (name, len(data)))
