package dev.aistack.hadoop;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local filesystem ({@code file:}) without a process per file.
 *
 * <p>Without Hadoop's native library (pip's pyspark has none), RawLocalFileSystem runs {@code
 * chmod} for every file and directory it creates with a permission, and {@code readlink} for
 * every link status it is asked: a streaming query's checkpoint, state store deltas and Parquet
 * files started about 38 processes a second from svc_transform's JVM at 1,000 events/s. Here a
 * permission is set, and a link read, through java.nio, with the same outcome; what java.nio
 * cannot express (the sticky bit, a filesystem without POSIX attributes) is left to Hadoop's own
 * way. The readlinks of a FileContext's renames are not served here (a FileContext keeps Hadoop's
 * RawLocalFs): a local checkpoint goes through the FileSystem instead
 * (shared.object_store.LOCAL_CHECKPOINT_MANAGER).
 */
public final class NioLocalFileSystem extends LocalFileSystem {

  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** The raw filesystem under the checksums. */
  public static final class Raw extends RawLocalFileSystem {

    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      Set<PosixFilePermission> posix = posix(permission);
      if (posix == null) {
        super.setPermission(path, permission);
        return;
      }
      try {
        Files.setPosixFilePermissions(pathToFile(path).toPath(), posix);
      } catch (UnsupportedOperationException e) {
        super.setPermission(path, permission);
      }
    }

    @Override
    public FileStatus getFileLinkStatus(Path path) throws IOException {
      File file = pathToFile(path);
      // Hadoop's status of a path that is not a link (or does not exist) is
      // its plain status, which needs no process; a link keeps Hadoop's way.
      if (!Files.isSymbolicLink(file.toPath())) {
        return getFileStatus(path);
      }
      return super.getFileLinkStatus(path);
    }
  }

  /** The permission as java.nio's, or null where it has more than rwx bits. */
  static Set<PosixFilePermission> posix(FsPermission permission) {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {
      return null;
    }
    Set<PosixFilePermission> found = EnumSet.noneOf(PosixFilePermission.class);
    PosixFilePermission[] order = {
      PosixFilePermission.OTHERS_EXECUTE,
      PosixFilePermission.OTHERS_WRITE,
      PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE,
      PosixFilePermission.GROUP_WRITE,
      PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE,
      PosixFilePermission.OWNER_WRITE,
      PosixFilePermission.OWNER_READ,
    };
    for (int bit = 0; bit < order.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        found.add(order[bit]);
      }
    }
    return found;
  }
}
