package dev.aistack.transform;

import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.FileDescriptor;
import java.io.IOException;
import java.io.InputStream;
import java.util.HashMap;
import java.util.Map;

/**
 * The aistack.v1 messages, from the descriptor set that shared.contracts.codegen
 * generates from proto/ (bundled in this jar): the same contract the Python
 * services compile, read at run time, so no Java code is generated.
 */
final class Contracts {
  static final String RESOURCE = "/aistack_v1.binpb";
  private static final Map<String, Descriptor> MESSAGES = load();

  private Contracts() {}

  static Descriptor message(String fullName) {
    Descriptor found = MESSAGES.get(fullName);
    if (found == null) {
      throw new IllegalArgumentException("no message " + fullName + " in " + RESOURCE);
    }
    return found;
  }

  private static Map<String, Descriptor> load() {
    try (InputStream in = Contracts.class.getResourceAsStream(RESOURCE)) {
      if (in == null) {
        throw new IllegalStateException(RESOURCE + " is not on the classpath");
      }
      FileDescriptorSet set = FileDescriptorSet.parseFrom(in);
      // --include_imports writes dependencies before the files that use them.
      Map<String, FileDescriptor> files = new HashMap<>();
      Map<String, Descriptor> messages = new HashMap<>();
      for (FileDescriptorProto proto : set.getFileList()) {
        FileDescriptor[] deps =
            proto.getDependencyList().stream().map(files::get).toArray(FileDescriptor[]::new);
        FileDescriptor file = FileDescriptor.buildFrom(proto, deps);
        files.put(proto.getName(), file);
        for (Descriptor message : file.getMessageTypes()) {
          messages.put(message.getFullName(), message);
        }
      }
      return messages;
    } catch (IOException | DescriptorValidationException e) {
      throw new IllegalStateException("cannot read " + RESOURCE, e);
    }
  }
}
